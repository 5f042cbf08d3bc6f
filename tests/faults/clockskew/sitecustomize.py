"""Imported by every Python process of a fault campaign (via PYTHONPATH): the control plane's
components, the launcher's shims, the workers.

- libfaketime 0.9.10 with FAKETIME_DONT_FAKE_MONOTONIC=1 fails Python's `time.sleep` with EINVAL (it
  sleeps with clock_nanosleep on CLOCK_MONOTONIC, TIMER_ABSTIME); timeouts of select, poll, epoll,
  locks and conditions are unaffected. So sleep waits on select here, as long as asked.
- With FAULTS_LOG=1, log records at INFO and above go to stderr stamped with the monotonic clock,
  the one the suite's own log and the workers' journal use (wall clocks may be skewed).
"""

import logging
import os
import select
import time


def _sleep(seconds: float) -> None:
    if seconds < 0:
        raise ValueError("sleep length must be non-negative")
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        select.select([], [], [], left)


def _stamp(record: logging.LogRecord) -> bool:
    record.monotonic = time.monotonic()
    return True


time.sleep = _sleep
if os.environ.get("FAULTS_LOG") == "1":
    handler = logging.StreamHandler()
    handler.addFilter(_stamp)
    handler.setFormatter(
        logging.Formatter("%(monotonic)10.1f %(process)d %(name)s %(levelname)s %(message)s")
    )
    logging.basicConfig(level=logging.INFO, handlers=[handler])
