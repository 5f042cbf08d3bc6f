# gpuyard: `make demo` runs the main job end to end on the embedded defaults; `make test` runs everything.
# Both build .venv themselves: torch (CPU build, from local disk) first, then the pinned rest.

# Debian's interpreter where there is one: every user may run it, so the local launcher's workers
# can run Python jobs as their teams' users (pyenv's under /root, mode 0700, keeps them root:
# docs/security.md). VENV=/elsewhere builds and uses another environment.
PYTHON ?= $(or $(wildcard /usr/bin/python3.11),python3)
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
CONSTRAINTS := requirements/constraints.txt
TORCH := torch==2.13.0
# Python's own bytecode cache, whatever the shell says: with PYTHONDONTWRITEBYTECODE set, every process
# the suite starts (API, schedulers, workers, Airflow's tasks, pods) compiled the project from source,
# and every xdist worker rewrote every test module's asserts again (6 CPU-s of its collection).
unexport PYTHONDONTWRITEBYTECODE

# Debian packages the suite drives: faketime skews one process's clock in the fault tests, chromium is
# the browser of the UI tests (Playwright drives it; it downloads no browser of its own).
SYSTEM_PACKAGES := faketime chromium

.PHONY: install demo demo-production ui test test-fast lint bench clean

install: $(STAMP)

# The repository's three distributions, editable: gpuyard (with every extra the suite needs), its HTTP
# client and its Airflow provider (clients/python, providers/airflow-provider-gpuyard: gpuyard and the
# pipelines depend on them by name, and no index has them).
DISTRIBUTIONS := -e ".[training,pipeline,dev,local-cluster]" -e clients/python -e providers/airflow-provider-gpuyard

$(STAMP): pyproject.toml clients/python/pyproject.toml providers/airflow-provider-gpuyard/pyproject.toml $(CONSTRAINTS) requirements/drop_feast_mlflow_plugin.py
	dpkg -s $(SYSTEM_PACKAGES) >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq $(SYSTEM_PACKAGES))
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "pip==26.0.1"
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -c $(CONSTRAINTS) $(DISTRIBUTIONS)
	$(BIN)/python requirements/drop_feast_mlflow_plugin.py
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m pipelines.demo

# The same DAG against the production topology on this machine: PostgreSQL, Redis, S3, two API
# workers, the relay, two schedulers with the Kubernetes launcher, an emulated cluster running the pods.
demo-production: $(STAMP)
	$(BIN)/python -m pipelines.demo_production

# The Airflow, gpuyard and MLflow UIs on what `make demo` left in .gpuyard/demo/.
ui: $(STAMP)
	$(BIN)/python -m pipelines.ui

# The suite runs on WORKERS pytest-xdist processes; a module's or folder's heavy fixture keeps its
# tests on one of them (--dist loadgroup, tests/conftest.py). Layout and budgets: tests/README.md.
WORKERS ?= 4
PYTEST_PARALLEL := -n $(WORKERS) --dist loadgroup

test: lint
	$(BIN)/pytest $(PYTEST_PARALLEL)

# While iterating (under 2 minutes): no test that starts a heavy system (make test runs them all).
test-fast: $(STAMP)
	$(BIN)/pytest $(PYTEST_PARALLEL) -m "not slow" -x -q

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check plugins training pipelines dags tests benchmarks spark_jobs feature_repo deploy requirements clients providers
	$(BIN)/lint-imports

bench: $(STAMP)
	$(BIN)/python benchmarks/submit_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
