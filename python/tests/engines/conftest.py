"""Engine tests: fixtures live in harness.py (a module name of its own, so
it never collides with python/tests/conftest.py)."""

from harness import cluster, server  # noqa: F401  (pytest fixtures)
