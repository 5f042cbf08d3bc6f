"""The HTTP API (FastAPI): jobs, teams and quotas, tokens, health and metrics."""
