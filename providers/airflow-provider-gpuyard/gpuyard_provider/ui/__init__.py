"""The gpuyard page in the Airflow UI: `app` (the FastAPI app, talking to gpuyard through its HTTP
client as the signed-in caller), `mount` (what the plugin mounts: the app, built on its first
request), `pages` (the HTML), `svg` (the pictures), `mlflow_links` (a job's MLflow run), `static/`
(the stylesheet and the script that refreshes the page in place)."""
