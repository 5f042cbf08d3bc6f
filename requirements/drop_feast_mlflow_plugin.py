"""Take Feast's MLflow request-header plugin out of this environment (run by `make install` and the image).

Feast 0.67 registers `feast.infra.data_sources.mlflow.auth:FeastMLflowHeaderProvider` under the entry
point group `mlflow.request_header_provider`. MLflow loads every plugin of that group on a process's
first request to a tracking server, and loading this one imports all of Feast (pandas, pyarrow,
SQLAlchemy, protobuf): about 7 s of CPU in every training worker, Airflow task and client that talks to
MLflow, before its first request. The provider adds a header only inside Feast's own MLflow data
sources, which gpuyard does not use, so without it every request is the same. This removes that one
group from Feast's entry points (idempotent); Feast's commands and everything else stay as installed.
"""

from __future__ import annotations

import configparser
import importlib.metadata
import io
from pathlib import Path

GROUP = "mlflow.request_header_provider"


def drop(distribution: str = "feast") -> str:
    """Remove GROUP from the distribution's entry points; says what it did."""
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return f"{distribution} is not installed (nothing to do)"  # an image without the pipeline extra
    path = Path(str(dist.locate_file(f"{dist.name}-{dist.version}.dist-info/entry_points.txt")))
    if not path.exists():
        raise SystemExit(f"{distribution} {dist.version}: no entry_points.txt at {path}")
    points = configparser.ConfigParser(delimiters=("=",), interpolation=None)
    points.optionxform = str  # type: ignore[assignment,method-assign]  # names are case-sensitive
    points.read(path)
    if not points.has_section(GROUP):
        return f"{distribution} {dist.version}: no {GROUP} plugin (nothing to do)"
    points.remove_section(GROUP)
    text = io.StringIO()
    points.write(text)
    path.write_text(text.getvalue())
    return (
        f"{distribution} {dist.version}: its {GROUP} plugin removed (MLflow clients no longer import Feast)"
    )


if __name__ == "__main__":
    print(drop())
