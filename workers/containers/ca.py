"""The operator's extra CA certificates as a first layer of every task image.

Behind a TLS-inspecting proxy, HTTPS from a build or a container (pip, uv, npm, curl) fails
unless the image trusts the proxy's CA. With COEVO_CONTAINER_CA_CERTS (a folder of ``.crt``
files; the host's local CA folder by default, when it holds any), every external base image
gets a layer with them: the files in the image's local CA folder (its bundle updated when it
has ``update-ca-certificates``), a bundle of certifi's roots and them, and ``SSL_CERT_FILE``,
``REQUESTS_CA_BUNDLE``, ``PIP_CERT``, ``CURL_CA_BUNDLE``, ``GIT_SSL_CAINFO`` and
``NODE_EXTRA_CA_CERTS`` pointing there. That layer is an image of its own
(``coevo-base:<hash>``), built once per base image and certificate set; every FROM of the base
is rewritten to it (workers/containers/images.py).
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path

import certifi
import docker.errors
from django.conf import settings

from workers.containers.build import FORMAT, context_tar, image_build
from workers.containers.engine import (
    KIND_CA_BASE,
    KIND_PROBE,
    LABEL_KIND,
    LABEL_MANAGED,
    ContainerUnavailable,
    coevo_labels,
    engine_client,
    engine_errors,
)
from workers.containers.state import build_lock, image_lookup

logger = logging.getLogger(__name__)

BASE_REPOSITORY = "coevo-base"
# The operator's CA folder: a handful of certificates, not a trust store.
MAX_CA_FILES = 64
MAX_CA_FILE_BYTES = 64 * 1024
# Where the CA layer puts things in an image.
CA_LOCAL_DIR = "/usr/local/share/ca-certificates/coevo"
CA_BUNDLE = "/usr/local/share/coevo/ca-bundle.crt"
CA_EXTRA = "/usr/local/share/coevo/extra-ca.crt"


@dataclass(frozen=True)
class CaCertificates:
    files: dict[str, bytes]  # name -> PEM, from the operator's folder
    digest: str


def ca_certificates() -> CaCertificates | None:
    """The operator's extra CA certificates (COEVO_CONTAINER_CA_CERTS), or None: set to
    ``none``, or a folder that does not exist or holds no ``.crt`` file."""
    setting = settings.COEVO_CONTAINER_CA_CERTS.strip()
    if not setting or setting.lower() == "none":
        return None
    folder = Path(setting)
    if not folder.is_dir():
        return None
    paths = sorted(path for path in folder.rglob("*.crt") if path.is_file())
    if len(paths) > MAX_CA_FILES:
        raise ContainerUnavailable(
            f"COEVO_CONTAINER_CA_CERTS={setting} holds {len(paths)} .crt files, over the "
            f"{MAX_CA_FILES} coevo takes: point it at a folder of just the extra certificates."
        )
    files: dict[str, bytes] = {}
    for path in paths:
        with path.open("rb") as handle:
            data = handle.read(MAX_CA_FILE_BYTES + 1)
        if len(data) > MAX_CA_FILE_BYTES or b"-----BEGIN CERTIFICATE-----" not in data:
            raise ContainerUnavailable(
                f"COEVO_CONTAINER_CA_CERTS: {path} is not a PEM certificate of at most "
                f"{MAX_CA_FILE_BYTES // 1024} KiB."
            )
        # Names flattened (a/b.crt -> a_b.crt): one folder in the image.
        files[str(path.relative_to(folder)).replace("/", "_")] = data
    if not files:
        return None
    digest = hashlib.sha256(json.dumps({k: v.hex() for k, v in files.items()}).encode())
    return CaCertificates(files=files, digest=digest.hexdigest())


def _ca_dockerfile(base: str, *, shell: bool) -> str:
    lines = [
        f"FROM {base}",
        f"COPY ca/ {CA_LOCAL_DIR}/",
        f"COPY ca-bundle.crt {CA_BUNDLE}",
        f"COPY extra-ca.crt {CA_EXTRA}",
    ]
    if shell:
        # The image's own bundle too (curl, apt, git read it); an image whose package set has
        # no update-ca-certificates gets it later if a RUN installs ca-certificates, whose
        # script reads the local CA folder.
        lines.append(
            'RUN ["/bin/sh", "-c", "if command -v update-ca-certificates >/dev/null 2>&1; '
            'then update-ca-certificates >/dev/null 2>&1 || true; fi"]'
        )
    variables = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "PIP_CERT", "CURL_CA_BUNDLE")
    env = [f"{name}={CA_BUNDLE}" for name in (*variables, "GIT_SSL_CAINFO")]
    # Node adds NODE_EXTRA_CA_CERTS to its own roots.
    env.append(f"NODE_EXTRA_CA_CERTS={CA_EXTRA}")
    lines.append("ENV " + " ".join(env))
    return "\n".join(lines) + "\n"


def _has_shell(reference: str) -> bool:
    """Whether the image has /bin/sh, seen without running it (a container created, its file
    looked up, removed): distroless images have none, and a RUN there would fail the build."""
    client = engine_client()
    with engine_errors("looking into an image"):
        container = client.api.create_container(
            reference,
            entrypoint=["/coevo-probe"],
            command=[],
            network_disabled=True,
            labels=coevo_labels(kind=KIND_PROBE),
        )
        try:
            stream, _ = client.api.get_archive(container["Id"], "/bin/sh")
            for _chunk in stream:
                pass
            return True
        except docker.errors.NotFound:
            return False
        finally:
            client.api.remove_container(container["Id"], force=True)


def ca_base(
    reference: str, image_id: str, ca: CaCertificates, *, timeout_s: float
) -> tuple[str, str]:
    """The CA-layered image of ``reference``, built once per (base image, certificates)."""
    tag = ca_tag(image_id, ca)
    with build_lock(tag.partition(":")[2], timeout_s=timeout_s):
        found = image_lookup(tag)
        if found:
            return tag, found
        # By id: the tag of a mapped or pulled name may move while this builds.
        dockerfile = _ca_dockerfile(image_id, shell=_has_shell(image_id))
        extras = "".join(
            data.decode("utf-8", "replace").strip() + "\n" for data in ca.files.values()
        )
        roots = Path(certifi.where()).read_text()
        files = {"Dockerfile": dockerfile.encode()}
        files.update({f"ca/{name}": data for name, data in ca.files.items()})
        files["extra-ca.crt"] = extras.encode()
        files["ca-bundle.crt"] = (roots.rstrip("\n") + "\n" + extras).encode()
        built = image_build(
            context=context_tar({}, files),
            dockerfile="Dockerfile",
            tag=tag,
            labels={LABEL_MANAGED: "1", LABEL_KIND: KIND_CA_BASE, "coevo.base": reference},
            timeout_s=timeout_s,
            memory_bytes=settings.COEVO_CONTAINER_BUILD_MEMORY_BYTES,
        )
        logger.info("CA layer for %s built as %s", reference, tag)
        return tag, built.image_id


def ca_tag(image_id: str, ca: CaCertificates) -> str:
    digest = hashlib.sha256(f"{FORMAT}|{image_id}|{ca.digest}".encode()).hexdigest()[:32]
    return f"{BASE_REPOSITORY}:{digest}"
