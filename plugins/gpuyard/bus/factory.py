"""Builds the bus the settings ask for."""

from __future__ import annotations

from gpuyard.bus.base import EventBus
from gpuyard.bus.memory import MemoryBus
from gpuyard.bus.redis_streams import RedisStreamsBus
from gpuyard.settings import Settings


def make_bus(settings: Settings) -> EventBus:
    if settings.bus == "redis":
        assert settings.redis_url  # guaranteed by Settings validation
        return RedisStreamsBus(
            settings.redis_url, stream=settings.redis_stream, timeout_s=settings.bus_timeout_seconds
        )
    return MemoryBus()
