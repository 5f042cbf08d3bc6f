"""Feast: point-in-time correct training sets, online/offline agreement, manifest, production variant."""

from __future__ import annotations

import datetime as dt
import json
import shutil

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines import features, storage, training_set
from pipelines.definition import load_config

pytestmark = pytest.mark.slow

PLANTED_LATER = 9999.0
PLANTED_EARLIER = -777.0


def test_apply_renders_outside_the_source_tree(feast_config) -> None:
    repo = features.repo_dir(feast_config)
    assert repo != features.SOURCE_REPO and (repo / "data" / "registry.db").is_file()
    assert (repo / "data" / "online_store.db").is_file()
    assert not (features.SOURCE_REPO / "data").exists()
    settings = json.loads((repo / "repo_settings.json").read_text())
    assert settings["offline_source"] == "file"
    assert settings["prepared_root"] == storage.local_path(storage.join(feast_config.data_root, "prepared"))
    service = features.feature_service(feast_config)
    assert service.name == "flight_delay_v1" and service.tags["version"] == "1"


def test_point_in_time_join_never_uses_a_later_value(feast_config, tmp_path) -> None:
    # a private copy of the prepared data, with two planted rows for one carrier
    config = feast_config.replace(
        data_root=storage.normalize_url(str(tmp_path)), feast_repo_dir=str(tmp_path / "repo")
    )
    shutil.copytree(storage.local_path(feast_config.data_root) + "/prepared", tmp_path / "prepared")
    labels = storage.read_partitions(
        storage.join(config.data_root, "prepared", "labels"), [dt.date(2013, 1, 11)], "labels"
    )
    label = labels[labels["carrier"] == "UA"].sort_values("event_timestamp").iloc[20]
    event = label["event_timestamp"]
    assert event.minute != 0  # the hourly feature row at the top of the hour comes before it
    planted = pd.DataFrame(
        {
            "carrier": ["UA", "UA"],
            "event_timestamp": [event - pd.Timedelta(seconds=1), event + pd.Timedelta(seconds=1)],
            "carrier_flights": [1, 1],
            "carrier_mean_arr_delay": [PLANTED_EARLIER, PLANTED_LATER],
            "carrier_late_share": [0.0, 1.0],
            "date": ["2013-01-11", "2013-01-11"],
        }
    )
    target = tmp_path / "prepared" / "carrier_delay_stats" / "date_month=2013-01" / "planted.parquet"
    existing = pq.read_schema(next((target.parent).glob("part-*.parquet")))
    pq.write_table(pa.Table.from_pandas(planted, preserve_index=False).cast(existing), target)

    features.apply(config)
    entity_df = training_set.entity_frame(config, dt.date(2013, 1, 11), dt.date(2013, 1, 11))
    joined = training_set.historical_features(config, entity_df)
    row = joined[joined["flight_id"] == label["flight_id"]].iloc[0]
    assert row["carrier_mean_arr_delay"] == PLANTED_EARLIER  # the newest value at or before the event
    later_at = event + pd.Timedelta(seconds=1)
    before = joined[joined["event_timestamp"] < later_at]
    assert PLANTED_LATER not in set(before["carrier_mean_arr_delay"])  # never visible before its timestamp
    # the plant is real: UA flights after it, until the next hourly row, do see it
    next_hour = event.floor("h") + pd.Timedelta(hours=1)
    window = joined[
        (joined["carrier"] == "UA")
        & (joined["event_timestamp"] >= later_at)
        & (joined["event_timestamp"] < next_hour)
    ]
    assert (window["carrier_mean_arr_delay"] == PLANTED_LATER).all()
    assert PLANTED_EARLIER not in set(
        joined.loc[joined["event_timestamp"] >= later_at, "carrier_mean_arr_delay"]
    )


def test_training_set_and_manifest(feast_config) -> None:
    result = training_set.build_training_set(feast_config)
    manifest = result.manifest
    data = pd.read_parquet(storage.local_path(result.data_url))
    with open(storage.local_path(result.manifest_url)) as handle:
        on_disk = json.load(handle)
    assert on_disk == manifest
    labels = pd.read_parquet(storage.local_path(storage.join(feast_config.data_root, "prepared", "labels")))
    assert manifest["row_count"] == len(data) == len(labels)
    assert manifest["label_column"] == "is_late" and set(data["is_late"]) == {0, 1}
    assert manifest["feature_service"]["name"] == "flight_delay_v1"
    assert manifest["feature_service"]["version"] == "1"
    assert manifest["data_snapshot_id"].startswith("sha256:")
    columns = manifest["feature_columns"]
    assert len(columns) == 22 and "carrier_late_share" in columns and "temp" in columns
    assert list(data.columns) == ["flight_id", "event_timestamp", *columns, "is_late"]
    assert all(pd.api.types.is_float_dtype(data[c]) for c in columns)
    assert not data[columns].isna().any().any()
    # same inputs, same snapshot id
    again = training_set.build_training_set(feast_config)
    assert again.manifest["data_snapshot_id"] == manifest["data_snapshot_id"]
    print(f"training set: {len(data)} rows built through Feast in {result.build_seconds:.1f}s")


def test_online_and_offline_values_agree(feast_config) -> None:
    at = pd.Timestamp("2013-01-13 05:00", tz="UTC")  # the end of the materialized window
    labels = storage.read_partitions(
        storage.join(feast_config.data_root, "prepared", "labels"), [dt.date(2013, 1, 12)], "labels"
    )
    last = labels.sort_values("event_timestamp").iloc[-1]
    entity = {
        "flight_id": last["flight_id"],
        "carrier": last["carrier"],
        "route": last["route"],
        "origin": last["origin"],
        "tailnum": last["tailnum"],
    }
    online = features.online_features(feast_config, [entity])
    offline = training_set.historical_features(
        feast_config, pd.DataFrame([{**entity, "event_timestamp": at}])
    ).iloc[0]
    service = features.feature_service(feast_config)
    compared = 0
    for column in training_set.feature_columns(service):
        on, off = online[column][0], offline[column]
        if off is None or pd.isna(off):
            assert on is None, column
        else:
            assert on == pytest.approx(float(off)), column
            compared += 1
    assert compared >= 18


def test_production_variant_selected_by_configuration(feast_config, tmp_path, monkeypatch) -> None:
    from feast.repo_config import load_repo_config

    config = feast_config.replace(feast_variant="production", feast_repo_dir=str(tmp_path / "prod"))
    repo = features.render_repo(config)
    monkeypatch.setenv("FEAST_REGISTRY_URL", "postgresql+psycopg://feast@db:5432/feast")
    monkeypatch.setenv("FEAST_REDIS_CONNECTION", "redis:6379,db=0")
    monkeypatch.setenv("SPARK_MASTER", "spark://spark-master:7077")
    repo_config = load_repo_config(repo, repo / "feature_store.yaml")
    assert repo_config.offline_store.type == "spark"
    assert repo_config.offline_store.spark_conf["spark.master"] == "spark://spark-master:7077"
    assert repo_config.online_store.type == "redis"
    assert repo_config.online_store.connection_string == "redis:6379,db=0"
    module = features.load_definitions(repo)
    assert type(module.carrier_delay_stats.batch_source).__name__ == "SparkSource"
    with pytest.raises(Exception, match="variant"):
        load_config(feast_variant="cloud")
