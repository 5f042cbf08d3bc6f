"""The gpuyard page in the Airflow UI: `app` (the FastAPI app the plugin mounts, talking to gpuyard
through its HTTP client as the signed-in caller), `pages` (the HTML), `svg` (the pictures), `static/`
(the stylesheet and the script that refreshes the page in place)."""
