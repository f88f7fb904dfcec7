#!/usr/bin/env bash
# Drive redis-cli through a scripted session against $STRATA_HOST:$STRATA_PORT and
# diff the transcript against redis_cli_session.expected (recorded from Redis 7).
# Usage: STRATA_PORT=6379 tests/compat/redis_cli_session.sh [--update]
# Normalised on purpose (and only these): HELLO server/version/id values,
# CONFIG GET numeric values, DBSIZE (printed as a delta), INFO (section check only).
set -u -o pipefail
HOST=${STRATA_HOST:-127.0.0.1}
PORT=${STRATA_PORT:?STRATA_PORT is required}
HERE=$(cd "$(dirname "$0")" && pwd)
EXPECTED=$HERE/redis_cli_session.expected
TMP=$(mktemp -d)
P=compat:cli:            # fixed prefix: key names appear in the transcript
trap 'rm -rf "$TMP"' EXIT

cli() { redis-cli -h "$HOST" -p "$PORT" "$@"; }
section() { printf '### %s\n' "$*"; }
cleanup_keys() { cli --scan --pattern "${P}*" | while IFS= read -r k; do cli DEL "$k" >/dev/null; done; }

if ! out=$(cli PING 2>&1) || [ "$out" != PONG ]; then
    echo "cannot reach server at $HOST:$PORT: $out" >&2; exit 2
fi
cleanup_keys

# deterministic binary payloads: a short one with NUL/CR/LF/0xff, and 64 KiB covering all byte values
printf 'a\0b\r\n\xff\x01end\0' > "$TMP/small.bin"
python3 -c 'import random,sys; sys.stdout.buffer.write(bytes(range(256)) + random.Random(1234).randbytes(65536))' > "$TMP/big.bin"

{
section "ping"
cli --no-raw PING
cli --no-raw PING "hello world"
cli --no-raw ECHO "a b"

section "one-connection session (stdin, RESP2)"
cli --no-raw <<CMDS
SET ${P}a hello
SET ${P}* star
GET ${P}a
SET ${P}a "with space"
GET ${P}a
GET ${P}missing
SET ${P}n 1 NX
SET ${P}n 2 NX
SET ${P}n 3 XX
SET ${P}xx 1 XX
GET ${P}n
SET ${P}x v NX XX
SET ${P}x v EX 0
SET ${P}x v EX -1
SET ${P}x v EX notanumber
GET ${P}x
STRLEN ${P}a
STRLEN ${P}missing
MSET ${P}m1 one ${P}m2 "" ${P}m3 three
MGET ${P}m1 ${P}m2 ${P}missing ${P}m3
MSET ${P}odd
EXISTS ${P}m1 ${P}m1 ${P}missing
DEL ${P}m3 ${P}missing ${P}m3
EXISTS ${P}m3
UNLINK ${P}n ${P}missing
TTL ${P}missing
PTTL ${P}missing
TTL ${P}a
PTTL ${P}a
SET ${P}t v EX 100
TTL ${P}t
EXPIRE ${P}a 1000
TTL ${P}a
SET ${P}a plain
TTL ${P}a
EXPIRE ${P}missing 10
SELECT 0
GET
NOSUCHCOMMAND x y
PING
CMDS

section "binary value via -x"
cli -x SET "${P}bin" < "$TMP/small.bin"
cli --no-raw GET "${P}bin"
cli --no-raw STRLEN "${P}bin"
cli --raw GET "${P}bin" > "$TMP/small.out"
head -c -1 "$TMP/small.out" | cmp -s - "$TMP/small.bin" && echo "raw readback: identical" || echo "raw readback: DIFFERENT"
cli -x SET "${P}big" < "$TMP/big.bin"
cli --no-raw STRLEN "${P}big"
cli --raw GET "${P}big" > "$TMP/big.out"
head -c -1 "$TMP/big.out" | cmp -s - "$TMP/big.bin" && echo "raw readback 64KiB: identical" || echo "raw readback 64KiB: DIFFERENT"
cli --no-raw GET "${P}big" | python3 -c '
import ast, sys
s = sys.stdin.buffer.read().rstrip(b"\n").decode("ascii")
data = ast.literal_eval("b" + s)   # redis-cli quotes like a C/Python string
print("no-raw readback 64KiB:", "identical" if data == open(sys.argv[1], "rb").read() else "DIFFERENT")
' "$TMP/big.bin"

section "scan / keys"
cli --scan --pattern "${P}*" | sort
cli --scan --pattern "${P}m*" | sort
cli KEYS "${P}m?" | sort
cli KEYS "${P}[ab]*" | sort
cli KEYS "${P}\\*"
cli --no-raw KEYS "${P}nomatch*"

section "dbsize"
before=$(cli DBSIZE)
cli --no-raw DBSIZE | sed -E 's/^\(integer\) [0-9]+$/(integer) <n>/'
cli MSET "${P}d1" 1 "${P}d2" 2 "${P}d3" 3 >/dev/null
after=$(cli DBSIZE)
echo "dbsize delta after 3 new keys: $((after - before))"

section "info"
cli INFO | tr -d '\r' > "$TMP/info"
grep -qx '# Server' "$TMP/info" && echo "INFO has # Server section" || echo "INFO lacks # Server section"
grep -q '^connected_clients:[0-9]' "$TMP/info" && echo "INFO has connected_clients" || echo "INFO lacks connected_clients"
cli INFO server | tr -d '\r' | sed -n 1p

section "config get"
cli --no-raw CONFIG GET maxmemory | sed -E 's/^2\) "[0-9]+"$/2) "<int>"/'
cli --no-raw CONFIG GET no-such-config-parameter-xyz

section "expiry"
cli SET "${P}exp" v PX 300 >/dev/null
deadline=$((SECONDS + 10)); gone=no
while [ $SECONDS -le $deadline ]; do
    if [ "$(cli EXISTS "${P}exp")" = 0 ]; then gone=yes; break; fi
    sleep 0.05
done
echo "key expired within deadline: $gone"
cli --no-raw GET "${P}exp"
cli --no-raw TTL "${P}exp"

section "RESP3 (-3)"
cli -3 --no-raw HELLO 3 | grep -E '"(server|version|proto|id|mode|role)"' \
    | sed -E 's/("server" => )"[^"]*"/\1<name>/; s/("version" => )"[^"]*"/\1<version>/; s/("id" => \(integer\) )[0-9]+/\1<id>/'
cli -3 --no-raw PING
cli -3 --no-raw GET "${P}missing"
cli -3 --no-raw GET "${P}a"
cli -3 --no-raw MGET "${P}m1" "${P}missing"
cli -3 --no-raw EXISTS "${P}m1" "${P}m1"
cli -3 --no-raw TTL "${P}missing"
cli -3 --no-raw SET "${P}x" v NX XX
cli -3 --no-raw CONFIG GET maxmemory | sed -E 's/^(1# "maxmemory" => )"[0-9]+"$/\1"<int>"/'
cli -3 --no-raw GET "${P}bin"
cli -3 --raw GET "${P}big" > "$TMP/big3.out"
head -c -1 "$TMP/big3.out" | cmp -s - "$TMP/big.bin" && echo "RESP3 raw readback 64KiB: identical" || echo "RESP3 raw readback 64KiB: DIFFERENT"
printf 'SET %sr3 v3\nGET %sr3\nDEL %sr3\nGET %sr3\n' "$P" "$P" "$P" "$P" | cli -3 --no-raw

section "cleanup"
cleanup_keys
cli --scan --pattern "${P}*" | wc -l | tr -d ' '
} > "$TMP/actual" 2>&1

if [ "${1:-}" = "--update" ]; then
    cp "$TMP/actual" "$EXPECTED"; echo "updated $EXPECTED"; exit 0
fi
if diff -u --label expected --label actual "$EXPECTED" "$TMP/actual"; then
    echo "redis-cli session: OK ($(grep -c '^###' "$EXPECTED") sections match)"
else
    echo "redis-cli session: MISMATCH (diff above: - expected, + actual)" >&2
    exit 1
fi
