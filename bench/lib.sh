# Helpers the comparison scripts share; source it, do not run it.

# A free TCP port on 127.0.0.1.
free_port() { python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])'; }

# Waits (up to 10 s) until 127.0.0.1:$1 accepts connections.
wait_port() {
    for _ in $(seq 200); do (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0; sleep 0.05; done
    echo "port $1 never opened" >&2
    return 1
}

# Waits (up to 60 s) until file $1 contains the text $2.
wait_log() {
    for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
    echo "$1 never said: $2" >&2
    return 1
}

# Installs the Debian packages named that are missing.
need_packages() {
    local need=() p
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
    done
    if ((${#need[@]})); then
        apt-get update -q && apt-get install -y -q "${need[@]}"
    fi
}

# A venv at $1 with Mooncake Store's Python client (the version every
# figure in docs/BENCHMARKS.md used) and numpy.
mooncake_venv() {
    if [[ ! -x $1/bin/python ]] || ! "$1/bin/python" -c 'import mooncake.store, numpy' 2>/dev/null; then
        python3 -m venv "$1"
        "$1/bin/pip" install -q mooncake-transfer-engine-non-cuda==0.3.13.post1 numpy
    fi
}
