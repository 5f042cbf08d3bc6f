"""gpuyard.memory: freed heap pages behind live blocks go back to the OS when asked."""

from __future__ import annotations

import subprocess
import sys

# In a fresh interpreter: 200 MB of 1 KB blocks, one in 64 kept alive so the freed ones around it
# cannot leave from the heap's top; the resident memory before and after the call.
PROBE = """
import sys
from gpuyard.memory import release_free_memory

def rss_mb():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

blocks = [bytes(1000) + bytes([i % 251]) for i in range(200_000)]
kept = blocks[::64]
del blocks
before = rss_mb()
released = release_free_memory() if sys.argv[1] == "release" else None
print(before, rss_mb(), released)
"""


def probe(mode: str) -> tuple[float, float, str]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True)
    before, after, released = out.stdout.split()
    return float(before), float(after), released


def test_freed_blocks_behind_live_ones_stay_resident_until_released() -> None:
    before, after, _ = probe("keep")
    assert before > 150 and after > before - 20  # the allocator keeps them

    before, after, released = probe("release")
    assert released == "True"  # glibc, as on every machine this runs on
    assert before > 150 and after < before - 120, (before, after)
