"""Training/serving parity: online features and the candidate's predictions on them match the offline
training-set path; a value served wrong online fails the step naming the flight, entity, feature and
both values."""

from __future__ import annotations

import shutil

import mlflow_targets
import pandas as pd
import pytest

from pipelines import features, parity, storage, training_set

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def private(feast_config, tmp_path_factory):
    """A copy of the prepared sample with its own Feast repository, a training set and a model in MLflow."""
    import mlflow
    import mlflow.sklearn
    import sklearn
    from sklearn.linear_model import LinearRegression

    root = tmp_path_factory.mktemp("parity")
    shutil.copytree(storage.local_path(feast_config.data_root) + "/prepared", root / "prepared")
    config = feast_config.replace(
        data_root=storage.normalize_url(str(root)), feast_repo_dir=str(root / "repo")
    )
    features.apply(config)
    features.materialize(config, features.serving_instant(config))
    built = training_set.build_training_set(config)
    data = pd.read_parquet(storage.local_path(built.data_url))
    columns = built.manifest["feature_columns"]
    tracking = f"sqlite:///{root}/mlflow.db"
    # No process-wide tracking URI is left behind for later tests (nor MLflow's default exported)
    with mlflow_targets.kept():
        mlflow.set_tracking_uri(tracking)
        experiment = mlflow.MlflowClient(tracking).create_experiment(
            "parity",
            artifact_location=(root / "artifacts").as_uri(),  # not ./mlruns of the cwd
        )
        with mlflow.start_run(experiment_id=experiment):
            model = LinearRegression().fit(data[columns].to_numpy(dtype="float32"), data["is_late"])
            # requirements named, as training/mlflow_tracking.py names them: inferring them runs the
            # model in a subprocess that imports what it needs (8 of the fixture's 20 CPU-s)
            info = mlflow.sklearn.log_model(
                model, name="model", pip_requirements=[f"scikit-learn=={sklearn.__version__}"]
            )
    return config, info.model_uri, built.manifest_url, tracking


def test_online_and_offline_agree_on_features_and_predictions(private) -> None:
    config, model_uri, manifest_url, tracking = private
    report = parity.check(config, model_uri, manifest_url, tracking, size=60)
    assert report.rows == 60 and report.features == 22
    assert report.max_feature_diff <= 1e-9 and report.max_prediction_diff <= 1e-6
    assert report.as_of == "2013-01-13T06:00:00+00:00"


def test_a_value_served_wrong_online_fails_naming_it(private) -> None:
    config, model_uri, manifest_url, tracking = private
    entities = parity.sample_entities(config, features.serving_instant(config), 60, 0)
    carrier = entities["carrier"].iloc[0]
    stats = storage.read_partitions(
        storage.join(config.data_root, "prepared", "carrier_delay_stats"),
        [config.end_date],
        "carrier_delay_stats",
    )
    latest = stats[stats["carrier"] == carrier].sort_values("event_timestamp").iloc[[-1]].copy()
    served = float(latest["carrier_mean_arr_delay"].iloc[0])
    latest["carrier_mean_arr_delay"] = served + 30.0  # the online store drifts from the offline truth
    store = features.get_store(config)
    store.write_to_online_store("carrier_delay_stats", latest.drop(columns=["date"]))
    try:
        with pytest.raises(parity.ParityFailed) as failed:
            parity.check(config, model_uri, manifest_url, tracking, size=60)
        message = str(failed.value)
        assert f"(carrier={carrier}): carrier_mean_arr_delay online {served + 30.0!r} != offline" in message
        assert "prediction online" in message
        wrong = [m for m in failed.value.mismatches if "carrier_mean_arr_delay" in m]
        assert len(wrong) == int((entities["carrier"] == carrier).sum())
    finally:
        features.materialize(config, features.serving_instant(config), start=config.start_date)


def test_differences_are_named_by_the_sources_key_whatever_the_source() -> None:
    entities = pd.DataFrame({"day": ["2013-03-30", "2013-03-31"], "station": ["SEA", "SEA"]})
    online = {"temp_mean_7d": [9.5, 11.0]}
    offline = pd.DataFrame({"temp_mean_7d": [9.5, 10.0]})
    mismatches, worst = parity.compare(entities, online, offline, {"temp_mean_7d": "station"}, "day")
    assert mismatches == ["day 2013-03-31 (station=SEA): temp_mean_7d online 11.0 != offline 10.0"]
    assert worst == 1.0
