from gpuyard.cli.main import app

app()
