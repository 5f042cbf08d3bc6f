"""One logging set-up for every gpuyard server process: level and format from the settings.

`text` (embedded default): one line per record, `key=value` pairs, readable and grep-able:
    ts=2026-12-01T11:40:00.123Z level=INFO logger=gpuyard.relay msg="relay started" batch=200
`json` (production default): one JSON object per line, what log collectors parse.
Fields a call passes in `extra=` (job_id, attempt_id, ...), and those of the `context` it runs in
(the API's request_id), are written on its line, and
an exception's traceback stays on the line (escaped). A bearer token (`gy_...`) is never written: it
is masked in the message and in every field.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
TOKEN = re.compile(r"gy_[0-9a-f]{16}_[A-Za-z0-9_\-]+")
# Libraries that log every request at INFO: their lines say nothing an operator needs.
QUIET = ("httpx", "httpcore", "urllib3", "kubernetes.client.rest", "alembic")
# Not fields of the line: the record's own attributes, and uvicorn's copy of its message in ANSI colours.
_STANDARD = {*vars(logging.LogRecord("", 0, "", 0, "", None, None)), "message", "asctime", "color_message"}
_BARE = re.compile(r"[^\s\"=\\]+")


_CONTEXT: ContextVar[tuple[tuple[str, str], ...]] = ContextVar("gpuyard_log_context", default=())


@contextmanager
def context(**values: str) -> Iterator[None]:
    """Write these fields on every line logged within the block (this task or thread, and the worker
    threads it hands work to: they run in a copy of its context)."""
    token = _CONTEXT.set((*_CONTEXT.get(), *values.items()))
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def mask(text: str) -> str:
    return TOKEN.sub("gy_***", text)


def fields(record: logging.LogRecord) -> dict[str, Any]:
    """The record as ordered fields: time, level, logger, message, the caller's extras, exception."""
    when = datetime.fromtimestamp(record.created, UTC)
    out: dict[str, Any] = {
        "ts": when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z",
        "level": record.levelname,
        "logger": record.name,
        "msg": mask(record.getMessage()),
        **dict(_CONTEXT.get()),
    }
    for key, value in vars(record).items():
        if key not in _STANDARD and not key.startswith("_"):
            out[key] = mask(value) if isinstance(value, str) else value
    if record.exc_info:
        out["exc"] = mask(logging.Formatter().formatException(record.exc_info))
    return out


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if _BARE.fullmatch(text) else json.dumps(text)


class KeyValueFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return " ".join(f"{key}={_value(value)}" for key, value in fields(record).items())


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        return json.dumps(fields(record), default=str)


FORMATS: dict[str, type[logging.Formatter]] = {"text": KeyValueFormatter, "json": JsonFormatter}


def configure(level: str, fmt: str, stream: TextIO | None = None) -> None:
    """Send every logger's records at `level` and above to `stream` (stderr) in format `fmt`; calling
    it again replaces the handler it installed (a process configures once, tests more often)."""
    if level not in LEVELS:
        raise ValueError(f"log_level: expected one of {LEVELS}, got {level!r}")
    if fmt not in FORMATS:
        raise ValueError(f"log_format: expected one of {sorted(FORMATS)}, got {fmt!r}")
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "gpuyard", False)]:
        root.removeHandler(handler)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(FORMATS[fmt]())
    handler.gpuyard = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
    for name in QUIET:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
