"""seattle_temperature's folder: its definition (pipeline.yaml) and its data source, Seattle's weather."""
