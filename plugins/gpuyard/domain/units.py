"""Parsing of resource quantities and durations, with errors that say what was expected."""

from __future__ import annotations

import re
from collections.abc import Callable

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
_DECIMAL = {"k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
_QUANTITY = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>Ki|Mi|Gi|Ti|k|M|G|T)?$")
_DURATION = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<unit>ms|s|m|h|d)$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}
_CPU = re.compile(r"^(?P<number>\d+(?:\.\d+)?)(?P<milli>m)?$")


def parse_bytes(value: str | int) -> int:
    """'16Gi' -> 17179869184; plain integers are bytes. Kubernetes quantity syntax."""
    if isinstance(value, bool):
        raise ValueError("expected a byte quantity such as '16Gi' or '512Mi', got a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a non-negative byte count, got {value}")
        return value
    match = _QUANTITY.match(value.strip()) if isinstance(value, str) else None  # 1.5 bytes: no
    if not match:
        raise ValueError(f"expected a byte quantity such as '16Gi' or '512Mi', got {value!r}")
    unit = match["unit"]
    factor = _BINARY.get(unit or "", _DECIMAL.get(unit or "", 1))
    return int(float(match["number"]) * factor)


def parse_cpu(value: str | int | float) -> float:
    """'500m' -> 0.5, '4' -> 4.0. Kubernetes CPU syntax."""
    return _positive(
        value,
        "a CPU amount such as 4 or '500m'",
        _CPU,
        lambda m: float(m["number"]) / (1000 if m["milli"] else 1),
    )


def parse_duration(value: str | int | float) -> float:
    """'10m' -> 600.0 seconds; plain numbers are seconds."""
    return _positive(
        value,
        "a duration such as '30s', '10m' or '1h'",
        _DURATION,
        lambda m: float(m["number"]) * _SECONDS[m["unit"]],
    )


def _positive(
    value: str | int | float, expected: str, syntax: re.Pattern[str], amount: Callable[[re.Match[str]], float]
) -> float:
    """A positive amount: a number as it is, or a string of `syntax` converted by `amount`."""
    if isinstance(value, bool):
        raise ValueError(f"expected {expected}, got a boolean")
    if isinstance(value, int | float):
        number = float(value)
    else:
        match = syntax.match(value.strip())
        if not match:
            raise ValueError(f"expected {expected}, got {value!r}")
        number = amount(match)
    if number <= 0:
        raise ValueError(f"expected a positive amount ({expected}), got {value!r}")
    return number
