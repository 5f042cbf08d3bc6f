"""Late and corrected raw data: a raw day landed again with corrections re-runs only the days its trailing
windows reach, and the training set built afterwards differs exactly there."""

from __future__ import annotations

import datetime as dt
import shutil

import pandas as pd
import pytest

from pipelines import corrections, features, prepare, storage, training_set
from pipelines.errors import ConfigError
from spark_jobs import layout

pytestmark = pytest.mark.slow

DAY = dt.date(2013, 1, 9)  # the raw day that arrives again
PREPARED = (dt.date(2013, 1, 6), dt.date(2013, 1, 12))
# a day before the corrected one, that day, and the day after: the point-in-time join pairs each
# label with every prepared row of its keys, so each training day costs ~1.3 CPU-s a build
TRAINING = (dt.date(2013, 1, 8), dt.date(2013, 1, 10))
LATER = 60.0  # minutes added to the arrival delay of the corrected flights


def _table(config, table: str) -> pd.DataFrame:
    days = layout.days(*PREPARED)
    frame = storage.read_partitions(storage.join(config.data_root, "prepared", table), days, table)
    return frame.sort_values(list(frame.columns[:2])).reset_index(drop=True)


def _changed(before: pd.DataFrame, after: pd.DataFrame, key: list[str]) -> pd.DataFrame:
    merged = before.merge(after, on=key, how="outer", suffixes=("", "_after"), indicator=True)
    assert (merged["_merge"] == "both").all(), "the same rows exist before and after"
    values = [c for c in before.columns if c not in key]
    differs = pd.Series(False, index=merged.index)
    for c in values:
        a, b = merged[c], merged[f"{c}_after"]
        differs |= ~((a == b) | (a.isna() & b.isna()))
    return merged[differs]


@pytest.fixture(scope="module")
def corrected(landed_config, tmp_path_factory):
    root = tmp_path_factory.mktemp("corrections")
    shutil.copytree(storage.local_path(landed_config.data_root) + "/raw", root / "raw")
    config = landed_config.replace(
        data_root=storage.normalize_url(str(root)),
        feast_repo_dir=str(root / "repo"),
        start_date=PREPARED[0],
        end_date=PREPARED[1],
        training_start_date=TRAINING[0],
        training_end_date=TRAINING[1],
        engine="pandas",  # the reach is the engines' shared rule; pandas is the quick one here
    )
    prepare.prepare(config)
    features.apply(config)
    before = {t: _table(config, t) for t in ("labels", "carrier_delay_stats", "route_delay_stats")}
    built = training_set.build_training_set(config)  # the same folder is rebuilt below: read it now
    set_before = (pd.read_parquet(storage.local_path(built.data_url)), built.manifest)
    # the raw partition of DAY lands again: United's arrivals were recorded an hour early
    raw_url = storage.join(config.data_root, "raw", "flights")
    raw = storage.read_partitions(raw_url, [DAY], "flights")
    fixed = (raw["carrier"] == "UA") & raw["arr_delay"].notna()
    raw.loc[fixed, "arr_delay"] += LATER
    storage.write_partition(raw, raw_url, DAY)
    rerun = corrections.reprepare(config, DAY)
    after = {t: _table(config, t) for t in before}
    built = training_set.build_training_set(config)
    set_after = (pd.read_parquet(storage.local_path(built.data_url)), built.manifest)
    flights = raw[fixed].assign(route=raw["origin"] + "-" + raw["dest"])
    return rerun, before, after, set_before, set_after, flights, config


def test_only_the_days_the_windows_reach_are_prepared_again(corrected) -> None:
    rerun, before, after, *_ = corrected
    assert rerun == (DAY, PREPARED[1])  # D .. D + look-back (9 days), clipped to what is prepared
    assert corrections.reach(DAY, 9, [dt.date(2013, 1, 1)]) is None
    for table in before:
        old, new = (
            t[t["date"] < DAY.isoformat()].reset_index(drop=True) for t in (before[table], after[table])
        )
        pd.testing.assert_frame_equal(old, new, obj=f"{table} before {DAY}")


def test_the_correction_reaches_its_flights_and_the_windows_after_them(corrected) -> None:
    _, before, after, _, _, flights, _ = corrected
    labels = _changed(before["labels"], after["labels"], ["flight_id"])
    assert len(labels) == len(flights) > 100 and set(labels["carrier"]) == {"UA"}
    assert set(labels["date"]) == {DAY.isoformat()}
    carriers = _changed(
        before["carrier_delay_stats"], after["carrier_delay_stats"], ["carrier", "event_timestamp"]
    )
    assert set(carriers["carrier"]) == {"UA"}
    first = pd.Timestamp(f"{DAY} 05:00", tz="UTC")  # local midnight starting DAY
    assert carriers["event_timestamp"].min() >= first
    # the 24 h windows reach into the next day, never past the last corrected arrival + 24 h (+ 2 h late)
    assert (carriers["date"] > DAY.isoformat()).any()
    assert carriers["event_timestamp"].max() <= first + pd.Timedelta(hours=24 + 24 + 2 + 24)
    routes = _changed(before["route_delay_stats"], after["route_delay_stats"], ["route", "event_timestamp"])
    assert set(routes["route"]) <= set(flights["route"]) and len(routes) > 0
    assert routes["date"].max() == PREPARED[1].isoformat()  # the 7-day windows reach past the prepared days


def test_the_training_set_differs_exactly_where_the_correction_reaches(corrected) -> None:
    _, _, after, built_before, built_after, flights, _ = corrected
    sets = [built_before[0], built_after[0]]
    fills = [built_before[1]["fill_values"], built_after[1]["fill_values"]]
    changed = _changed(*sets, ["flight_id"])
    labels = after["labels"].set_index("flight_id")
    meta = labels.loc[changed["flight_id"], ["carrier", "route", "date"]].reset_index(drop=True)
    changed = changed.reset_index(drop=True)
    reached = meta["carrier"].eq("UA") | meta["route"].isin(set(flights["route"]))
    assert (meta["date"] >= DAY.isoformat()).all()  # nothing before the corrected day
    assert (meta.loc[reached, "date"] > DAY.isoformat()).any()  # ... and forward past it
    # outside the corrected carrier and routes, a value changes only where it was missing: the fill
    # (the training set's medians) moved with the corrected values
    columns = built_after[1]["feature_columns"]
    for _, row in changed[~reached].iterrows():
        for c in columns:
            if row[c] != row[f"{c}_after"]:
                assert (row[c], row[f"{c}_after"]) == (fills[0][c], fills[1][c]), (row["flight_id"], c)
    # every United flight of the next morning (its 24 h window holds corrected arrivals) changed
    ua = sets[1].merge(labels[["carrier", "date"]], left_on="flight_id", right_index=True)
    next_day = (DAY + dt.timedelta(days=1)).isoformat()
    ua = ua[(ua["carrier"] == "UA") & (ua["date"] == next_day)]
    ua = ua[ua["event_timestamp"] < pd.Timestamp(f"{next_day} 12:00", tz="UTC")]
    moved = changed.loc[reached, ["flight_id", "carrier_mean_arr_delay", "carrier_mean_arr_delay_after"]]
    moved = moved[moved["carrier_mean_arr_delay"] != moved["carrier_mean_arr_delay_after"]]
    assert len(ua) > 0 and set(ua["flight_id"]) <= set(moved["flight_id"])


def test_spans_merge_the_reaches_and_leave_out_the_days_a_run_prepares_anyway() -> None:
    day = dt.date
    prepared = [day(2013, 1, d) for d in range(1, 25)]
    assert corrections.spans([day(2013, 1, 3)], 9, prepared) == [(day(2013, 1, 3), day(2013, 1, 12))]
    # two corrected days: overlapping reaches merge; the run's own days (13..24) are left out
    two = [day(2013, 1, 8), day(2013, 1, 2)]
    assert corrections.spans(two, 9, prepared, skip=(day(2013, 1, 13), day(2013, 1, 24))) == [
        (day(2013, 1, 2), day(2013, 1, 12))
    ]
    assert corrections.spans([day(2013, 1, 3)], 2, prepared, skip=(day(2013, 1, 4), day(2013, 1, 4))) == [
        (day(2013, 1, 3), day(2013, 1, 3)),
        (day(2013, 1, 5), day(2013, 1, 5)),
    ]
    assert corrections.spans([day(2013, 2, 1)], 9, prepared) == []  # nothing prepared in its reach


def test_raw_asset_correction_events_name_their_partition_s_day() -> None:
    events = [("2013-01-21", {}), ("2013-01-09", {"correction": True}), ("2013-01-10", None)]
    assert corrections.corrected_days(events) == [dt.date(2013, 1, 9)]
    with pytest.raises(ConfigError, match="partition key must be a day, YYYY-MM-DD, got '2013-13-01'"):
        corrections.corrected_days([("2013-13-01", {"correction": True})])


def test_a_run_re_prepares_only_the_reach_outside_its_own_days(corrected) -> None:
    # the DAG's reprepare_corrections: a run preparing Jan 11..12 itself leaves those to its prepare
    config = corrected[-1]
    own = (dt.date(2013, 1, 11), PREPARED[1])
    assert corrections.reprepare_days(config, [DAY], skip=own) == [(DAY, dt.date(2013, 1, 10))]
    assert corrections.reprepare_days(config, [], skip=own) == []
