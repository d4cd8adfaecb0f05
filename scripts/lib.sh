# Shared by scripts/demo and scripts/test: idempotent installation steps.
VENV="${COEVO_VENV:-$PWD/.venv}"
PYTHON="${PYTHON:-python3}"

step() { printf '\n==> %s\n' "$*"; }

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
        "$PYTHON" -m venv "$VENV"
        "$VENV/bin/python" -m pip install -q --upgrade pip
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
        rm -rf "$wheels.partial"
        CMAKE_ARGS="$cmake_args" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
            "$VENV/bin/python" -m pip wheel -v --no-deps --no-cache-dir -w "$wheels.partial" \
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
        rm -rf "$wheels"
        mv "$wheels.partial" "$wheels"
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
