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

# Installs the project with the given extras unless pyproject.toml is unchanged since the last
# successful install. llama-cpp-python compiles llama.cpp from source: pip caches the built
# wheel, so only the first install on a machine pays for it.
ensure_python_packages() {
    local extras="$1"
    local stamp="$VENV/.coevo-installed-$extras"
    local digest
    digest="$(sha256sum pyproject.toml | cut -d' ' -f1)"
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$digest" ]; then
        return 0
    fi
    step "installing Python dependencies (coevo[$extras])"
    if [[ ",$extras," == *",embedded,"* ]] && ! "$VENV/bin/python" -c "import llama_cpp" 2>/dev/null; then
        echo "Building llama-cpp-python from source: this compiles llama.cpp and takes several"
        echo "minutes (about 8 on 2 cores). The built wheel is cached for later installs."
        local log="${TMPDIR:-/tmp}/coevo-llama-build.$$.log"
        local started=$SECONDS
        CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}" \
            "$VENV/bin/python" -m pip install -v "llama-cpp-python[server]==0.3.36" >"$log" 2>&1 &
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
        echo "  built and installed in $((SECONDS - started))s"
        rm -f "$log"
    fi
    "$VENV/bin/python" -m pip install -q -e ".[$extras]"
    echo "$digest" >"$stamp"
}
