"""Engine tests: fixtures live in harness.py (a module name of its own, so
it never collides with python/tests/conftest.py)."""

from harness import bed, cluster, cluster_name, etcd, etcd_url, server  # noqa: F401  (pytest fixtures)
