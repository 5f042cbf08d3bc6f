"""What this machine offers the local launcher: NVIDIA GPUs when present, else declared CPU slots."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from gpuyard.domain.fleet import Fleet, local_fleet


@dataclass(frozen=True)
class LocalInventory:
    gpu_type: str  # "cpu" for CPU slots: jobs that accept type cpu run here
    slots: int
    gpu_memory_gb: float
    real_gpus: bool

    def fleet(self) -> Fleet:
        return local_fleet(self.slots, gpu_type=self.gpu_type, gpu_memory_gb=self.gpu_memory_gb)

    def describe(self) -> str:
        if self.real_gpus:
            return f"{self.slots} x {self.gpu_type} GPU ({self.gpu_memory_gb:g} GiB)"
        return f"{self.slots} CPU slot(s), GPU type 'cpu' (no GPU on this machine)"


def discover(cpu_slots: int) -> LocalInventory:
    """Ask nvidia-smi; without it (or without GPUs) declare `cpu_slots` CPU slots."""
    if shutil.which("nvidia-smi"):
        try:
            listing = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
                    capture_output=True,
                    text=True,
                    timeout=20,
                    check=True,
                )
                .stdout.strip()
                .splitlines()
            )
        except (OSError, subprocess.SubprocessError):
            listing = []
        if listing:
            name, memory_mib = (part.strip() for part in listing[0].split(","))
            gpu_type = name.lower().replace("nvidia", "").strip().split()[0]
            return LocalInventory(gpu_type, len(listing), round(float(memory_mib) / 1024, 1), True)
    return LocalInventory("cpu", cpu_slots, 0.0, False)
