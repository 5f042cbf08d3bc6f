"""A pass run every so often in a thread of its own, as the emulated cluster's controllers run: the
binder, the node lifecycle controller, each node agent."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)


class Periodic:
    """`step` every `every_s` in a daemon thread named `name`, from `start()` until `stop()`. A pass
    that fails is logged and the next one tries again (the API server may be away a moment)."""

    def __init__(self, name: str, every_s: float, step: Callable[[], object]):
        self.name, self.every_s, self.step = name, every_s, step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.step()
            except Exception:
                log.exception("%s: pass failed", self.name)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
