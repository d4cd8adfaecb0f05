"""Git bundles in and out of a harness repository: the header read without touching any
repository, verification (thin bundles name the commits they build on), a strictly checked
fetch into a quarantine namespace, and writing a bundle of a candidate's history."""

from __future__ import annotations

import contextlib
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import git

from coevo.errors import HarnessStoreError, InvalidBundle, MissingPrerequisites
from harness_store.repo_base import RepoBase, git_stderr, stdin_file

# Where a bundle's refs land while its commits are checked and indexed; deleted afterwards.
QUARANTINE_REF_PREFIX = "refs/coevo/quarantine/"
# Temporary names for the tips of bundles coevo writes (a bundle records refs, not bare SHAs).
EXPORT_REF_PREFIX = "refs/coevo/export/"


@dataclass(frozen=True)
class BundleHeader:
    """What a bundle says about itself: the commits it needs and the refs it carries."""

    prerequisites: tuple[str, ...]
    refs: tuple[tuple[str, str], ...]  # (sha, refname), in the bundle's order
    pack_offset: int  # where the pack data starts, after the header's blank line


class BundleMethods(RepoBase):
    """The bundle part of :class:`harness_store.repo.HarnessRepo`."""

    def bundle_verify(self, path: Path) -> BundleHeader:
        """Check that ``path`` is a complete bundle this repository can apply.

        Raises InvalidBundle for a file that is not a bundle and MissingPrerequisites (with the
        SHAs) for a thin bundle whose prerequisite commits this repository lacks. The pack itself
        is checked when it is fetched (a truncated pack passes ``git bundle verify``).
        """
        header = read_bundle_header(Path(path))
        try:
            self._repo.git.execute(["git", "bundle", "verify", str(path)])
        except git.GitCommandError as exc:
            stderr = git_stderr(exc)
            if "lacks these prerequisite commits" in stderr:
                listed = set(_SHA_LINE.findall(stderr))
                missing = [sha for sha in header.prerequisites if sha in listed] or sorted(listed)
                raise MissingPrerequisites(
                    f"The bundle builds on {len(missing)} commit(s) this project does not have "
                    f"({', '.join(sha[:12] for sha in missing)}). Create the bundle again without "
                    "excluding them (ask the server which commits it knows: POST candidates/known/), "
                    "or send a full bundle of the history.",
                    missing=missing,
                ) from exc
            raise InvalidBundle(
                f"The bundle cannot be applied: {stderr or 'git bundle verify failed'}. "
                "Create it again with `git bundle create FILE <ref> --not <known commits>`."
            ) from exc
        return header

    def bundle_fetch(self, path: Path, header: BundleHeader) -> tuple[str, dict[str, str]]:
        """Unpack a verified bundle's objects and point a fresh quarantine namespace at its refs.

        Every object is checked as it is unpacked (``index-pack --strict``: malformed objects
        and links to objects neither in the pack nor in the repository are refused). This is
        what ``git fetch`` from a bundle would do with ``transfer.fsckObjects``, except that git
        before 2.46 does not apply that setting to bundles, so coevo runs the check itself.
        Returns the namespace (drop it with ``delete_refs(refs_under(namespace))``) and
        ``{refname: commit SHA}``. A failure leaves no ref (the objects dangle until gc).
        """
        namespace = f"{QUARANTINE_REF_PREFIX}{uuid.uuid4().hex}/"
        names = list(dict.fromkeys(name for _, name in header.refs))
        targets = dict((name, sha) for sha, name in reversed(header.refs))
        try:
            with open(path, "rb", buffering=0) as pack:
                # The child process reads the descriptor from here on: the pack after the header.
                pack.seek(header.pack_offset)
                self._repo.git.execute(
                    ["git", "index-pack", "--stdin", "--fix-thin", "--strict"], istream=pack
                )
            self._update_refs(
                [f"create {namespace}{i} {targets[name]}" for i, name in enumerate(names)]
            )
            tips = {
                name: self._peel_commit(f"{namespace}{i}", name=name)
                for i, name in enumerate(names)
            }
        except (git.GitCommandError, HarnessStoreError, InvalidBundle) as exc:
            with contextlib.suppress(HarnessStoreError):
                self.delete_refs(self.refs_under(namespace))
            detail = git_stderr(exc) if isinstance(exc, git.GitCommandError) else str(exc)
            raise InvalidBundle(
                f"The bundle is corrupt or incomplete ({detail}). Create it again with "
                "`git bundle create FILE <ref> --not <known commits>` and upload the whole file."
            ) from exc
        return namespace, tips

    def bundle_create(self, path: Path, tip_sha: str, *, exclude: Sequence[str] = ()) -> None:
        """Write a bundle of ``tip_sha`` and its ancestry, less what ``exclude`` reaches.

        A bundle records refs, not bare commits, so the tip travels as
        ``refs/coevo/export/<sha>``; import it by SHA.
        """
        sha = self._commit(tip_sha).hexsha
        excluded = [self._commit(other).hexsha for other in exclude]
        ref = f"{EXPORT_REF_PREFIX}{sha}"
        with self.write_lock():
            self._repo.git.update_ref(ref, sha)
            # Revisions on stdin: a thousand `^sha` would make a long command line.
            revisions = "".join(f"{rev}\n" for rev in [ref, *(f"^{o}" for o in excluded)])
            try:
                with stdin_file(revisions) as stdin:
                    self._repo.git.execute(
                        [
                            "git",
                            "bundle",
                            "create",
                            "--quiet",
                            str(Path(path).resolve()),
                            "--stdin",
                        ],
                        istream=stdin,
                    )
            except git.GitCommandError as exc:
                raise HarnessStoreError(f"Could not create the bundle: {git_stderr(exc)}") from exc
            finally:
                self._repo.git.update_ref("-d", ref)

    def _peel_commit(self, rev: str, *, name: str) -> str:
        try:
            return self._repo.git.rev_parse("--verify", "--quiet", f"{rev}^{{commit}}").strip()
        except git.GitCommandError:
            raise InvalidBundle(f"the bundle's ref {name} does not point to a commit") from None


_BUNDLE_SIGNATURES = (b"# v2 git bundle\n", b"# v3 git bundle\n")
_SHA_LINE = re.compile(r"\b([0-9a-f]{40})\b")
_MAX_BUNDLE_HEADER = 1024 * 1024


def read_bundle_header(path: Path) -> BundleHeader:
    """Parse a bundle's text header (format v2 or v3) without touching any repository."""
    not_a_bundle = InvalidBundle(
        "This is not a git bundle. Create one with `git bundle create FILE <ref> --not "
        "<commits the server knows>` and upload that file."
    )
    with open(path, "rb") as handle:
        head = handle.read(_MAX_BUNDLE_HEADER)
    if not head.startswith(_BUNDLE_SIGNATURES):
        raise not_a_bundle
    end = head.find(b"\n\n")
    if end < 0:
        raise not_a_bundle
    try:
        lines = head[: end + 1].decode("ascii").splitlines()[1:]
    except UnicodeDecodeError:
        raise not_a_bundle from None
    prerequisites: list[str] = []
    refs: list[tuple[str, str]] = []
    for line in lines:
        if line.startswith("@"):
            capability = line[1:]
            if capability.startswith("filter="):
                raise InvalidBundle(
                    "This is a partial (filtered) bundle, which lacks file contents. "
                    "Create it without --filter."
                )
            if capability.startswith("object-format=") and capability != "object-format=sha1":
                raise InvalidBundle("Only SHA-1 repositories are supported.")
            continue
        if line.startswith("-"):
            sha = line[1:].split(" ", 1)[0]
            if not _FULL_SHA.fullmatch(sha):
                raise not_a_bundle
            prerequisites.append(sha)
            continue
        sha, _, name = line.partition(" ")
        if not _FULL_SHA.fullmatch(sha) or not _REF_NAME.fullmatch(name):
            raise InvalidBundle(f"The bundle names an unusable ref {name!r}: {not_a_bundle}")
        refs.append((sha, name))
    if not refs:
        raise InvalidBundle("The bundle carries no refs; name a branch or HEAD when creating it.")
    return BundleHeader(prerequisites=tuple(prerequisites), refs=tuple(refs), pack_offset=end + 2)


_FULL_SHA = re.compile(r"[0-9a-f]{40}")
# Ref names come from the upload and reach git's command line and users' screens: only plain
# names, nothing git could read as an option, a refspec or a pattern.
_REF_NAME = re.compile(r"HEAD|refs/[A-Za-z0-9._/+@-]+")
