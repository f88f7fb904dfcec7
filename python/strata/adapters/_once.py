"""A log for the adapters' failures: the first of each kind with its
reason, the rest only counted (a storage outage must not flood an engine's
log, and a silent miss must still say why once)."""

from __future__ import annotations

import logging
import threading
from typing import Any, Dict


class OnceLog:
    def __init__(self, logger: logging.Logger, what: str) -> None:
        self.counts: Dict[str, int] = {}
        self._logger = logger
        self._what = what
        self._lock = threading.Lock()

    def __call__(self, kind: str, detail: Any) -> None:
        with self._lock:
            n = self.counts.get(kind, 0)
            self.counts[kind] = n + 1
        if n == 0:
            self._logger.warning(
                "%s: %s failed: %s (further failures of this kind are counted, not logged)",
                self._what, kind, detail,
            )
