"""Pure DataFrame -> DataFrame transformations of the preparation jobs (no I/O here).

Times: the raw tables carry local wall-clock fields (year, month, day, hhmm). Every event timestamp the jobs
emit is UTC, derived with the IANA time zone of the airport (``airports.tzone``, plus overrides for the
few destinations the reference table lacks). The session clock must be UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T

FLIGHT_KEY = ("date", "carrier", "flight", "origin", "sched_dep_time")
WEATHER_COLUMNS = (
    "temp",
    "dewp",
    "humid",
    "wind_dir",
    "wind_speed",
    "wind_gust",
    "precip",
    "pressure",
    "visib",
)
# Physically possible ranges; values outside become null (they are sensor or entry errors).
WEATHER_RANGES: Mapping[str, tuple[float, float]] = {
    "temp": (-60.0, 130.0),  # Fahrenheit
    "dewp": (-80.0, 100.0),
    "humid": (0.0, 100.0),
    "wind_dir": (0.0, 360.0),
    "wind_speed": (0.0, 150.0),  # mph; the raw data has a 1048 mph reading
    "wind_gust": (0.0, 200.0),
    "precip": (0.0, 10.0),  # inches per hour
    "pressure": (900.0, 1100.0),  # millibar
    "visib": (0.0, 100.0),  # miles
}
DELAY_RANGE = (-240.0, 2880.0)  # minutes: an arrival 4 h early or 2 days late is an entry error


def _hhmm_minutes(col: Column) -> Column:
    """Minutes after midnight of an ``hhmm`` integer; null when not a valid clock time (2400 is midnight)."""
    hours = F.floor(col / 100)
    minutes = col % 100
    valid = col.isNotNull() & (col >= 0) & (hours <= 24) & (minutes < 60) & ~((hours == 24) & (minutes > 0))
    return F.when(valid, hours * 60 + minutes).cast("int")


def _wall_clock(year: Column, month: Column, day: Column, minutes: Column) -> Column:
    """A timestamp whose UTC reading is the local wall clock ``date + minutes`` (session clock is UTC)."""
    midnight = F.unix_timestamp(F.to_timestamp(F.make_date(year, month, day)))
    return F.timestamp_seconds(midnight + minutes.cast("long") * 60)


def to_utc(wall: Column, zone: Column, zones: Sequence[str]) -> Column:
    """``to_utc_timestamp(wall, zone)`` with each of ``zones`` a literal: a zone column is parsed again on
    every row, a literal zone once (null where the zone is not among ``zones``)."""
    converted = F.lit(None).cast("timestamp")
    for name in reversed(zones):
        converted = F.when(zone == name, F.to_utc_timestamp(wall, name)).otherwise(converted)
    return converted


def timezone_table(spark: SparkSession, airports: DataFrame, overrides: Mapping[str, str]) -> DataFrame:
    """``faa -> tzone`` from the airports reference table, with ``overrides`` winning."""
    base = airports.select(F.upper(F.trim("faa")).alias("faa"), F.col("tzone").alias("tzone")).where(
        F.col("tzone").isNotNull()
    )
    if overrides:
        extra = spark.createDataFrame(sorted(overrides.items()), "faa string, tzone string")
        base = base.join(extra.select("faa"), "faa", "left_anti").unionByName(extra)
    return base.dropDuplicates(["faa"])


def clean_flights(raw: DataFrame) -> DataFrame:
    """Types, trimmed codes, impossible values to null, rows without a usable key dropped, duplicates removed.

    Duplicates share the flight key (date, carrier, flight number, origin, scheduled departure); the kept row
    is the most complete one (arrival known, then departure known, then latest departure time).
    """
    code = lambda c: F.nullif(F.upper(F.trim(F.col(c).cast("string"))), F.lit(""))  # noqa: E731
    delay = lambda c: F.when(  # noqa: E731
        F.col(c).cast("double").between(*DELAY_RANGE), F.col(c).cast("double")
    )
    typed = raw.select(
        F.col("date").cast("string").alias("date"),
        F.substring(F.col("date").cast("string"), 1, 7).alias("date_month"),
        F.col("year").cast("int").alias("year"),
        F.col("month").cast("int").alias("month"),
        F.col("day").cast("int").alias("day"),
        F.col("dep_time").cast("double").alias("dep_time"),
        F.col("sched_dep_time").cast("int").alias("sched_dep_time"),
        delay("dep_delay").alias("dep_delay"),
        F.col("arr_time").cast("double").alias("arr_time"),
        F.col("sched_arr_time").cast("int").alias("sched_arr_time"),
        delay("arr_delay").alias("arr_delay"),
        code("carrier").alias("carrier"),
        F.col("flight").cast("int").alias("flight"),
        code("tailnum").alias("tailnum"),
        code("origin").alias("origin"),
        code("dest").alias("dest"),
        F.when(F.col("air_time").cast("double").between(1, 1500), F.col("air_time").cast("double")).alias(
            "air_time"
        ),
        F.when(F.col("distance").cast("double") > 0, F.col("distance").cast("double")).alias("distance"),
    )
    usable = typed.where(
        F.col("carrier").isNotNull()
        & F.col("flight").isNotNull()
        & F.col("origin").isNotNull()
        & F.col("dest").isNotNull()
        & F.col("distance").isNotNull()
        & _hhmm_minutes(F.col("sched_dep_time")).isNotNull()
        & _hhmm_minutes(F.col("sched_arr_time")).isNotNull()
        & F.make_date("year", "month", "day").isNotNull()
    )
    # The window sorts by its partition columns first. A number made of the date, the departure
    # time and the flight number leads them: Spark compares sort keys by an 8-byte prefix of the
    # first one, and the month and date strings are equal across a whole partition, so every
    # comparison fell through to the strings. It need not be unique: rows of one flight key share
    # it, and the columns after it still separate the keys. date_month (a function of date) stays
    # in the key: input clustered by month, as prepare_flights reads it, needs no other shuffle.
    slot = (F.unix_date(F.to_date("date")).cast("long") * 2401 + F.col("sched_dep_time")) * 100_000 + F.pmod(
        F.col("flight"), F.lit(100_000)
    )
    usable = usable.withColumn("_slot", slot)
    order = Window.partitionBy("_slot", "date_month", *FLIGHT_KEY).orderBy(
        F.col("arr_delay").isNull(),
        F.col("dep_delay").isNull(),
        F.col("dep_time").desc_nulls_last(),
        F.col("tailnum").asc_nulls_last(),
    )
    deduped = usable.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank", "_slot")
    return deduped.withColumn(
        "flight_id",
        F.concat_ws(
            "-",
            "date",
            "carrier",
            F.col("flight").cast("string"),
            "origin",
            F.lpad(F.col("sched_dep_time"), 4, "0"),
        ),
    ).withColumn("route", F.concat_ws("-", "origin", "dest"))


def add_flight_times(
    flights: DataFrame, timezones: DataFrame, zones: Sequence[str] | None = None
) -> DataFrame:
    """Adds UTC times: ``sched_dep_ts``, ``sched_arr_ts``, ``arrival_ts`` (actual, null if it never arrived).

    The scheduled arrival is the destination's local clock time on the departure date, or the next day when
    that would not be after the departure (overnight flights). The actual arrival is the scheduled one plus
    ``arr_delay``. A flight whose destination has no known time zone gets null arrival times; one whose
    origin has none is dropped. ``flights`` are clean (valid dates and clock times). ``zones``: the
    distinct zones of ``timezones`` when the caller has them (else a job finds them).
    """
    if zones is None:
        zones = [r.tzone for r in timezones.select("tzone").distinct().collect()]
    zones = sorted(set(zones))
    tz = F.broadcast(timezones)
    # an inner join on the origin's zone keeps exactly the flights whose departure converts (every
    # zone of the table does, and the clean flights' wall clocks are valid): filtering on a null
    # ``sched_dep_ts`` after a left join had Spark push that filter below the destination's join
    # with the whole conversion inlined in it, computed twice per row
    with_tz = flights.join(
        tz.withColumnRenamed("faa", "origin").withColumnRenamed("tzone", "origin_tz"), "origin", "inner"
    ).join(tz.withColumnRenamed("faa", "dest").withColumnRenamed("tzone", "dest_tz"), "dest", "left")
    walls = with_tz.withColumns(
        {
            "_dep_wall": _wall_clock(
                F.col("year"), F.col("month"), F.col("day"), _hhmm_minutes(F.col("sched_dep_time"))
            ),
            "_arr_wall": _wall_clock(
                F.col("year"), F.col("month"), F.col("day"), _hhmm_minutes(F.col("sched_arr_time"))
            ),
        }
    )
    # one column per conversion: each zone branch reads a column, not a copy of the expression
    converted = walls.withColumns(
        {
            "sched_dep_ts": to_utc(F.col("_dep_wall"), F.col("origin_tz"), zones),
            "_arr_same_day": to_utc(F.col("_arr_wall"), F.col("dest_tz"), zones),
            "_arr_next_day": to_utc(F.col("_arr_wall") + F.expr("INTERVAL 1 DAY"), F.col("dest_tz"), zones),
        }
    )
    timed = converted.withColumn(
        "sched_arr_ts",
        F.when(F.col("_arr_same_day") > F.col("sched_dep_ts"), F.col("_arr_same_day")).otherwise(
            F.col("_arr_next_day")
        ),
    ).drop("_dep_wall", "_arr_wall", "_arr_same_day", "_arr_next_day")
    return timed.withColumn(
        "arrival_ts",
        F.when(
            F.col("arr_delay").isNotNull(),
            F.timestamp_seconds(F.unix_timestamp("sched_arr_ts") + (F.col("arr_delay") * 60).cast("long")),
        ),
    )


def labels(flights: DataFrame, late_minutes: int) -> DataFrame:
    """One row per flight that arrived: keys, ``event_timestamp`` (scheduled departure), ``is_late``,
    ``date`` and its ``date_month``."""
    return flights.where(F.col("arr_delay").isNotNull()).select(
        "flight_id",
        F.col("sched_dep_ts").alias("event_timestamp"),
        "carrier",
        "origin",
        "dest",
        "route",
        "tailnum",
        F.col("arr_delay"),
        (F.col("arr_delay") > late_minutes).cast("int").alias("is_late"),
        "date",
        "date_month",
    )


def schedule_features(flights: DataFrame) -> DataFrame:
    """Per-flight features known when the flight is scheduled, stamped at its scheduled departure."""
    dep_minutes = _hhmm_minutes(F.col("sched_dep_time"))
    return flights.select(
        "flight_id",
        F.col("sched_dep_ts").alias("event_timestamp"),
        F.col("distance").cast("double").alias("distance"),
        (dep_minutes / 60).cast("int").alias("sched_dep_hour"),
        F.dayofweek(F.make_date("year", "month", "day")).alias("sched_dep_weekday"),
        F.col("month").alias("month"),
        ((F.unix_timestamp("sched_arr_ts") - F.unix_timestamp("sched_dep_ts")) / 60.0).alias(
            "sched_block_minutes"
        ),
        "date",
        "date_month",
    )


def hourly_grid(
    spark: SparkSession, start_utc: dt.datetime, end_utc: dt.datetime, step_hours: int = 1
) -> DataFrame:
    """One row per UTC hour ``grid_h`` (hours since the epoch) in ``[start_utc, end_utc)`` that is a multiple
    of ``step_hours`` (the refresh cadence of a statistic)."""
    epoch = dt.datetime(1970, 1, 1)
    first = int((start_utc - epoch).total_seconds() // 3600)
    last = int((end_utc - epoch).total_seconds() // 3600)
    first += (-first) % step_hours
    return spark.range(first, last, step_hours).withColumnRenamed("id", "grid_h")


def _local_month(hours: Column, home_timezone: str) -> Column:
    """The first day of the local month (in ``home_timezone``) of ``hours`` since the epoch (UTC)."""
    return F.trunc(F.to_date(F.from_utc_timestamp(F.timestamp_seconds(hours * 3600), home_timezone)), "month")


def delay_window_stats(
    flights: DataFrame,
    grid: DataFrame,
    entity: str,
    window_hours: int,
    late_minutes: int,
    prefix: str,
    home_timezone: str,
    partitions: int | None = None,
) -> DataFrame:
    """Trailing-window delay statistics per ``entity`` at every hour ``T`` of ``grid``.

    A flight counts at ``T`` only if it had ARRIVED by ``T`` (``arrival_ts <= T``) and arrived within the
    window (``arrival_ts > T - window``). Each flight is bucketed at the first full hour at or after its
    arrival, so a running sum over the ``window_hours`` buckets ending at ``T`` is exactly that set.
    Output: ``<entity>, event_timestamp (=T), <prefix>_flights, <prefix>_mean_arr_delay, <prefix>_late_share,
    date`` (local date of ``T`` in ``home_timezone``) and its ``date_month``.

    One shuffle, by the local month of ``T``: each hourly bucket goes to every month whose points its
    window reaches (its own and, for the last ``window_hours`` of a month, the next), so the range
    window runs within (month, entity) and its output is clustered by month, as the month files are
    written (``partitions``: how many shuffle partitions; default the session's).
    """
    arrived = flights.where(F.col("arrival_ts").isNotNull())
    buckets = (
        arrived.select(
            entity,
            F.ceil(F.unix_timestamp("arrival_ts") / 3600).cast("long").alias("grid_h"),
            F.col("arr_delay"),
            (F.col("arr_delay") > late_minutes).cast("long").alias("late"),
        )
        .groupBy(entity, "grid_h")
        .agg(F.count("*").alias("n"), F.sum("arr_delay").alias("delay_sum"), F.sum("late").alias("late_sum"))
    )
    # the months of the points a bucket counts for: T in [h, h + window - 1] (a few hours wider: a
    # month more is harmless, a month less would lose the bucket there)
    reach = F.sequence(
        _local_month(F.col("grid_h") - 3, home_timezone),
        _local_month(F.col("grid_h") + window_hours + 2, home_timezone),
        F.expr("INTERVAL 1 MONTH"),
    )
    spread = (
        buckets.select(
            F.explode(reach).alias("_month"),
            entity,
            "grid_h",
            "n",
            "delay_sum",
            "late_sum",
            F.lit(False).alias("is_grid"),
            F.lit(None).cast("string").alias("date"),
        )
        .withColumn("date_month", F.date_format("_month", "yyyy-MM"))
        .drop("_month")
    )
    ts = F.timestamp_seconds(F.col("grid_h") * 3600)
    local_day = F.date_format(F.from_utc_timestamp(ts, home_timezone), "yyyy-MM-dd")
    stamped = grid.select("grid_h", local_day.alias("date")).withColumn(
        "date_month", F.substring("date", 1, 7)
    )
    entities = flights.select(entity).where(F.col(entity).isNotNull()).distinct()
    points = (
        F.broadcast(entities)
        .crossJoin(stamped)
        .select(
            "date_month",
            entity,
            "grid_h",
            F.lit(0).cast("long").alias("n"),
            F.lit(0.0).alias("delay_sum"),
            F.lit(0).cast("long").alias("late_sum"),
            F.lit(True).alias("is_grid"),
            "date",
        )
    )
    months = (
        points.sparkSession.conf.get("spark.sql.shuffle.partitions") if partitions is None else partitions
    )
    by_month = spread.unionByName(points).repartition(int(months), "date_month")
    # the window's sums as two running sums, up to T and up to T - window (as pandas computes them):
    # a running frame adds each row once, where a sliding range frame re-adds its whole window on
    # every row (the route table's 168 hours: most of its CPU). The sums are of whole minutes and
    # counts, exact in a double, so the difference is the window's sum to the last bit
    by_hour = Window.partitionBy("date_month", entity).orderBy("grid_h")
    upto = by_hour.rangeBetween(Window.unboundedPreceding, 0)
    before = by_hour.rangeBetween(Window.unboundedPreceding, -window_hours)

    def _window_sum(column: str) -> Column:
        return F.sum(column).over(upto) - F.coalesce(F.sum(column).over(before), F.lit(0).cast("long"))

    summed = by_month.select(
        "date_month",
        entity,
        "grid_h",
        "is_grid",
        "date",
        _window_sum("n").alias("n"),
        _window_sum("delay_sum").alias("delay_sum"),
        _window_sum("late_sum").alias("late_sum"),
    )
    return summed.where("is_grid").select(
        entity,
        ts.alias("event_timestamp"),
        F.col("n").alias(f"{prefix}_flights"),
        F.when(F.col("n") > 0, F.col("delay_sum") / F.col("n")).alias(f"{prefix}_mean_arr_delay"),
        F.when(F.col("n") > 0, F.col("late_sum") / F.col("n")).alias(f"{prefix}_late_share"),
        "date",
        "date_month",
    )


def clean_weather(raw: DataFrame, timezones: DataFrame) -> DataFrame:
    """Hourly weather per origin airport: impossible readings to null, one row per (airport, hour)."""
    measures = [
        F.when(F.col(c).cast("double").between(*WEATHER_RANGES[c]), F.col(c).cast("double")).alias(c)
        for c in WEATHER_COLUMNS
    ]
    typed = raw.select(
        F.col("date").cast("string").alias("date"),
        F.upper(F.trim("origin")).alias("origin"),
        F.col("year").cast("int").alias("year"),
        F.col("month").cast("int").alias("month"),
        F.col("day").cast("int").alias("day"),
        F.col("hour").cast("int").alias("hour"),
        *measures,
    ).where(F.col("origin").isNotNull() & F.col("hour").between(0, 23))
    tz = F.broadcast(timezones.withColumnRenamed("faa", "origin"))
    wall = _wall_clock(F.col("year"), F.col("month"), F.col("day"), F.col("hour") * 60)
    stamped = typed.join(tz, "origin", "inner").withColumn(
        "event_timestamp", F.to_utc_timestamp(wall, F.col("tzone"))
    )
    completeness = sum(F.col(c).isNotNull().cast("int") for c in WEATHER_COLUMNS)
    order = Window.partitionBy("origin", "event_timestamp").orderBy(
        F.desc(completeness), *[F.col(c) for c in WEATHER_COLUMNS]
    )
    return (
        stamped.withColumn("_rank", F.row_number().over(order))
        .where("_rank = 1")
        .select("origin", "event_timestamp", *WEATHER_COLUMNS, "date")
    )


def plane_snapshots(planes: DataFrame, days: DataFrame) -> DataFrame:
    """Plane attributes as known on each day of ``days`` (columns ``date``, ``event_timestamp``)."""
    typed = planes.select(
        F.upper(F.trim("tailnum")).alias("tailnum"),
        F.col("year").cast("double").alias("plane_year"),
        F.when(F.col("seats").cast("double") > 0, F.col("seats").cast("double")).alias("seats"),
        F.when(F.col("engines").cast("double") > 0, F.col("engines").cast("double")).alias("engines"),
    ).where(F.col("tailnum").isNotNull())
    order = Window.partitionBy("tailnum").orderBy(F.col("plane_year").desc_nulls_last(), "seats", "engines")
    unique = typed.withColumn("_rank", F.row_number().over(order)).where("_rank = 1").drop("_rank")
    snap = unique.crossJoin(F.broadcast(days))
    year_of_day = F.year(F.to_date("date"))
    valid_year = F.col("plane_year").between(1900, year_of_day)
    return snap.select(
        "tailnum",
        "event_timestamp",
        F.when(valid_year, F.col("plane_year")).alias("plane_year"),
        F.when(valid_year, year_of_day - F.col("plane_year")).cast("double").alias("plane_age_years"),
        "seats",
        "engines",
        "date",
    )


def day_table(spark: SparkSession, days: list[dt.date], starts_utc: list[dt.datetime]) -> DataFrame:
    """``date`` (string) and ``event_timestamp`` (UTC start of that local day) for each day."""
    schema = T.StructType(
        [
            T.StructField("date", T.StringType(), False),
            T.StructField("event_timestamp", T.TimestampNTZType(), False),
        ]
    )
    frame = spark.createDataFrame([(d.isoformat(), s) for d, s in zip(days, starts_utc, strict=True)], schema)
    return frame.withColumn("event_timestamp", F.to_timestamp(F.col("event_timestamp").cast("string")))
