#!/usr/bin/env bash
# Prints the path of a Python venv holding the inference engines the
# adapter tests drive (LMCache, SGLang: python/tests/engines/requirements*.txt),
# building it first if needed. The venv is machine-wide, outside any
# checkout (${STRATA_CACHE_DIR:-~/.cache/strata}/engines-<hash of the pinned
# requirements>), so every clone on this machine reuses it; changing a pin
# builds a new one. The first build downloads about 6.5 GB (PyPI's torch and
# its CUDA wheels, used here on the CPU) and takes 5-10 minutes.
# Progress goes to stderr; stdout is only the path.
set -euo pipefail
cd "$(dirname "$0")/.."
REQ=python/tests/engines
key=$(cat "$REQ"/requirements.txt "$REQ"/requirements-nodeps.txt "$REQ"/requirements-sglang.txt | sha256sum | cut -c1-12)
CACHE=${STRATA_CACHE_DIR:-$HOME/.cache/strata}
VENV=$CACHE/engines-$key
probe='import lmcache, sglang, torchvision; from sglang.srt.managers.cache_controller import HiCacheController'
if [ -f "$VENV/.complete" ] && "$VENV/bin/python" -c "$probe" 2>/dev/null; then
  echo "$VENV"
  exit 0
fi
echo "building the engines venv at $VENV (first time: ~6.5 GB download, 5-10 min)" >&2
mkdir -p "$CACHE"
rm -rf "$VENV"
python3 -m venv "$VENV"
pip() { "$VENV/bin/pip" install -q --disable-pip-version-check --progress-bar off "$@" >&2; }
pip -r "$REQ"/requirements.txt
torch=$("$VENV/bin/python" -c 'import torch; print(torch.__version__.split("+")[0])')
# SGLang: no deps (its full set is CUDA-only), then what its KV-cache
# modules import; torchvision pinned to LMCache's torch so nothing moves it.
pip --no-deps -r "$REQ"/requirements-nodeps.txt
pip -r "$REQ"/requirements-sglang.txt "torch==$torch" pytest 'numpy<3'
"$VENV/bin/python" -c "$probe" >&2
touch "$VENV/.complete"
echo "$VENV"
