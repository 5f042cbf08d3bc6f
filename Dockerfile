# syntax=docker/dockerfile:1
# The gpuyard image: the control plane (gpuyard api | scheduler | relay | migrate) and the worker
# runtime (training/, the pipeline steps), installed from the project's wheels (not editable: gpuyard,
# its HTTP client and, with the pipeline extra, its Airflow provider) with the pinned versions of
# requirements/constraints.txt. docs/operations.md says how to build and push it:
#   docker build -t ghcr.io/gpuyard/gpuyard:0.1.0 .                                  # CPU torch
#   docker build --build-arg TORCH_VARIANT=cu128 -t ghcr.io/gpuyard/gpuyard:0.1.0-cu128 .
#   docker build --build-arg EXTRAS= -t ghcr.io/gpuyard/gpuyard-control-plane:0.1.0 .   # no torch, no Airflow
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VARIANT=cpu
# The wheel's extras: training (torch: the worker runtime), pipeline (Airflow with gpuyard's provider,
# Spark, Feast, MLflow, Great Expectations: the pipeline steps). Empty: the control plane alone.
ARG EXTRAS=pipeline,training
WORKDIR /src
RUN python -m venv /opt/gpuyard && /opt/gpuyard/bin/pip install --no-cache-dir pip==26.0.1 setuptools==84.2.1
# torch first, from PyTorch's index for the variant (cpu, cu126, cu128, ...): the largest layer, cached.
RUN case ",${EXTRAS}," in *,training,*) /opt/gpuyard/bin/pip install --no-cache-dir torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/${TORCH_VARIANT} ;; esac
COPY requirements/constraints.txt requirements/constraints.txt
COPY pyproject.toml README.md ./
COPY plugins/ plugins/
COPY training/ training/
COPY spark_jobs/ spark_jobs/
COPY pipelines/ pipelines/
COPY feature_repo/ feature_repo/
COPY clients/python/ clients/python/
COPY providers/airflow-provider-gpuyard/ providers/airflow-provider-gpuyard/
COPY requirements/drop_feast_mlflow_plugin.py requirements/drop_feast_mlflow_plugin.py
# The client and the provider by their wheels' paths: no index has them, and none is asked for them.
RUN /opt/gpuyard/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
        clients/python providers/airflow-provider-gpuyard \
 && provider="" && case ",${EXTRAS}," in *,pipeline,*) provider=$(ls /wheels/airflow_provider_gpuyard-*.whl) ;; esac \
 && /opt/gpuyard/bin/pip install --no-cache-dir -c requirements/constraints.txt \
        $(ls /wheels/gpuyard_client-*.whl) ${provider} "gpuyard[${EXTRAS}] @ file://$(ls /wheels/gpuyard-*.whl)" \
 && /opt/gpuyard/bin/python requirements/drop_feast_mlflow_plugin.py

FROM ${PYTHON_IMAGE}
RUN groupadd --gid 10001 gpuyard \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/gpuyard --create-home --shell /usr/sbin/nologin gpuyard
COPY --from=build /opt/gpuyard /opt/gpuyard
ENV PATH=/opt/gpuyard/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    GPUYARD_HOME=/var/lib/gpuyard
USER 10001:10001
WORKDIR /var/lib/gpuyard
# The API; the scheduler's and the relay's probes and metrics (settings: port, *_probe_port).
EXPOSE 8080 9101 9102
ENTRYPOINT ["gpuyard"]
CMD ["--help"]
