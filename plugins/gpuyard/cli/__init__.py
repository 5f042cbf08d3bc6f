"""The `gpuyard` command line."""

from gpuyard.cli.main import app

__all__ = ["app"]
