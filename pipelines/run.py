"""Runs the data steps in order from a pipeline definition: ingest, validate raw, prepare, validate
features, feast apply, materialize, training set. One function per step for Airflow; this is the CLI.

    python -m pipelines.run --config pipelines/flights.yaml --start-date 2013-01-01 --end-date 2013-01-31
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import sys
import time
from collections.abc import Sequence

from pipelines import features, ingest, prepare, training_set, validate
from pipelines.config import PipelineConfig, load_config
from pipelines.errors import DataPipelineError

log = logging.getLogger("pipelines.run")

STEPS = (
    "ingest",
    "validate_raw",
    "prepare",
    "validate_features",
    "feast_apply",
    "materialize",
    "training_set",
)


def run_steps(config: PipelineConfig, steps: Sequence[str] = STEPS) -> dict[str, object]:
    """Run ``steps`` in pipeline order; the first failure (e.g. a failed validation suite) stops the run."""
    unknown = [s for s in steps if s not in STEPS]
    if unknown:
        raise DataPipelineError(f"unknown step(s) {unknown}; expected some of {list(STEPS)}")
    outputs: dict[str, object] = {}
    for step in (s for s in STEPS if s in steps):
        started = time.perf_counter()
        log.info("step %s ...", step)
        if step == "ingest":
            outputs[step] = ingest.ingest(config).rows
        elif step == "validate_raw":
            outputs[step] = [r.report_url for r in validate.validate_raw(config)]
        elif step == "prepare":
            outputs[step] = prepare.prepare(config)
        elif step == "validate_features":
            outputs[step] = [r.report_url for r in validate.validate_features(config)]
        elif step == "feast_apply":
            outputs[step] = features.apply(config)
        elif step == "materialize":
            end = dt.datetime.combine(config.end_date + dt.timedelta(days=1), dt.time(6, 0))
            outputs[step] = features.materialize(config, end)
        elif step == "training_set":
            result = training_set.build_training_set(config)
            outputs[step] = {"manifest": result.manifest_url, "rows": result.manifest["row_count"]}
        log.info("step %s done in %.1fs", step, time.perf_counter() - started)
    return outputs


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    parser = argparse.ArgumentParser(description="run the flights data pipeline steps in order")
    parser.add_argument(
        "--config", default=None, help="pipeline definition YAML (default pipelines/flights.yaml)"
    )
    parser.add_argument("--data-root", default=None)
    parser.add_argument("--start-date", default=None)
    parser.add_argument("--end-date", default=None)
    parser.add_argument("--training-start-date", default=None)
    parser.add_argument("--training-end-date", default=None)
    parser.add_argument(
        "--steps", default=",".join(STEPS), help=f"comma-separated subset of {','.join(STEPS)}"
    )
    args = parser.parse_args(argv)
    try:
        config = load_config(
            args.config,
            data_root=args.data_root,
            start_date=args.start_date,
            end_date=args.end_date,
            training_start_date=args.training_start_date,
            training_end_date=args.training_end_date,
        )
        outputs = run_steps(config, [s.strip() for s in args.steps.split(",") if s.strip()])
    except DataPipelineError as exc:
        print(f"pipeline failed: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(outputs, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
