"""Errors raised by the data plane: each names what was expected and what came."""

from __future__ import annotations


class DataPipelineError(Exception):
    """Base class for every error the data plane raises on bad input or bad data."""


class ConfigError(DataPipelineError):
    """A pipeline definition, date, URL or option is invalid."""


class MissingDataError(DataPipelineError):
    """A table or partition the step needs does not exist under the data root."""


class ValidationFailed(DataPipelineError):
    """A Great Expectations suite failed; the message lists failing expectations with examples."""

    def __init__(self, suite: str, failures: list[str], report_url: str) -> None:
        self.suite = suite
        self.failures = failures
        self.report_url = report_url
        lines = "\n".join(f"  - {f}" for f in failures)
        super().__init__(
            f"validation suite {suite!r} failed {len(failures)} expectation(s):\n{lines}\n"
            f"Data Docs: {report_url}"
        )
