"""The embedded profile's tracking server (pipelines/tracking_server.py) and what a pipeline makes for
its training jobs: experiments whose artifacts the server holds, roots every team's user may write in,
and a clear refusal of an experiment a file store made."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import fsspec
import psutil
import pytest

from pipelines import lineage, storage
from pipelines.definition import HOME_VARIABLE, load_definition
from pipelines.errors import ConfigError
from pipelines.tracking_server import TrackingServer


def test_a_shared_root_is_made_mode_1777_and_an_existing_directory_is_left_as_it_is(tmp_path: Path) -> None:
    made = tmp_path / "data" / "checkpoints"
    storage.shared_root(made.as_uri())
    assert stat.S_IMODE(made.stat().st_mode) == 0o1777 and made.stat().st_uid == os.getuid()
    kept = tmp_path / "kept"
    kept.mkdir(mode=0o750)
    storage.shared_root(str(kept))
    assert stat.S_IMODE(kept.stat().st_mode) == 0o750  # the platform opens no path it did not make
    storage.shared_root("memory://bucket/checkpoints")  # an object store's grants are its own


@pytest.mark.slow  # `mlflow server` starts and creates its schema: 35-77 s on this loaded machine
def test_through_the_server_an_experiment_s_artifacts_are_served_and_a_file_store_s_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_bucket: str
) -> None:
    """The server as production runs it: its artifacts in an object store (moto's S3 over HTTP),
    which only the server reaches; its clients upload and download through it."""
    monkeypatch.setenv(HOME_VARIABLE, str(tmp_path))
    definition = load_definition("flights_delay")
    root = Path(storage.local_path(definition.data.root))
    assert definition.artifact_location == storage.join(definition.data.root, "mlartifacts")  # a file store
    from mlflow.tracking import MlflowClient

    with TrackingServer(root, tmp_path / "mlflow.log", artifacts=f"{s3_bucket}/mlflow") as server:
        monkeypatch.setenv("MLFLOW_TRACKING_URI", server.url)
        for name, value in server.provision(()).env().items():  # as the pipeline's identity
            monkeypatch.setenv(name, value)
        assert definition.tracking_uri == server.url and definition.artifact_location is None
        assert server.process is not None
        started = [" ".join(p.cmdline()) for p in psutil.Process(server.process.pid).children(recursive=True)]
        assert started and not [c for c in started if "huey" in c], started  # no idle job consumers
        client = MlflowClient(server.url)
        experiment = client.get_experiment(lineage.experiment_id(definition))
        assert experiment.name == definition.experiment
        assert experiment.artifact_location.startswith("mlflow-artifacts:")
        run = client.create_run(experiment.experiment_id).info.run_id
        (tmp_path / "report.txt").write_text("served")
        with monkeypatch.context() as without_s3:  # the client knows no object store: it goes through
            for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
                without_s3.delenv(name)
            client.log_artifact(run, str(tmp_path / "report.txt"))
            fetched = client.download_artifacts(run, "report.txt", str(tmp_path / "fetched"))
        assert Path(fetched).read_text() == "served"
        stored = fsspec.filesystem("s3").find(f"{s3_bucket}/mlflow")
        assert [p.rsplit("/", 1)[1] for p in stored] == ["report.txt"], stored
        assert not (root / "mlartifacts").exists()

        client.create_experiment("old", artifact_location=(root / "old-artifacts").as_uri())
        old = definition.model_copy(
            update={"mlflow": definition.mlflow.model_copy(update={"experiment": "old"})}
        )
        with pytest.raises(
            ConfigError, match=r"experiment 'old' at http://127\.0\.0\.1:\d+ keeps its artifacts"
        ):
            lineage.experiment_id(old)
    assert (root / "mlflow.db").is_file()
