"""What Airflow's providers manager reads from the `apache_airflow_provider` entry point: the connection
type with its form, the hook, operator, trigger and extra link. `package-name` must be the
distribution's name: Airflow refuses a mismatch, and with it discovers no provider at all.

The gpuyard page's plugin is not listed here: Airflow 3.3 loads a provider's `plugins` only with
`[core] lazy_discover_providers = False`, and a plugin found twice is an import error. The
`airflow.plugins` entry point (pyproject.toml) registers it in every deployment.
"""

from __future__ import annotations

from typing import Any

PACKAGE = "gpuyard_provider"
INTEGRATION = "gpuyard"


def get_provider_info() -> dict[str, Any]:
    return {
        "package-name": "airflow-provider-gpuyard",
        "name": "gpuyard",
        "description": "Train on gpuyard's GPU fleet from Airflow: the `gpuyard` connection, "
        "GpuTrainingOperator (deferrable, checkpoint-aware), GpuJobTrigger and the job link.",
        "integrations": [{"integration-name": INTEGRATION, "tags": ["software"]}],
        "operators": [{"integration-name": INTEGRATION, "python-modules": [f"{PACKAGE}.operators.training"]}],
        "hooks": [{"integration-name": INTEGRATION, "python-modules": [f"{PACKAGE}.hooks.gpuyard"]}],
        "triggers": [{"integration-name": INTEGRATION, "python-modules": [f"{PACKAGE}.triggers.job"]}],
        "extra-links": [f"{PACKAGE}.links.GpuyardJobLink"],
        "connection-types": [
            {
                "connection-type": "gpuyard",
                "hook-class-name": f"{PACKAGE}.hooks.gpuyard.GpuyardHook",
                "hook-name": "gpuyard",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "login", "extra"],
                    "relabeling": {"host": "API URL", "password": "Token"},
                    "placeholders": {
                        "host": "http://127.0.0.1:8080",
                        "password": "a team token (gpuyard token create --team TEAM)",
                    },
                },
                "conn-fields": {
                    "ui_url": {
                        "label": "Job link URL",
                        "description": "Where the training task's job link points (<url>/jobs/<id>): the "
                        "gpuyard page, e.g. http://airflow:8080/gpuyard. Default: the API's job resource.",
                        "schema": {"type": ["string", "null"]},
                    },
                    "mlflow_ui_url": {
                        "label": "MLflow UI URL",
                        "description": "The MLflow UI where the gpuyard page links a job's run "
                        "(none when empty).",
                        "schema": {"type": ["string", "null"]},
                    },
                    "scheme": {
                        "label": "Scheme",
                        "description": "http or https, when API URL is a host name (with Port) "
                        "rather than a URL.",
                        "schema": {"type": ["string", "null"], "default": "http"},
                    },
                },
            }
        ],
    }
