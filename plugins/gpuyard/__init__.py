"""gpuyard: the GPU job control plane (spec, store, API, outbox, bus, scheduler, launchers, CLI)."""

__version__ = "0.1.0"
