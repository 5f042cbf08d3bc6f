from gpuyard.cli import app

app()
