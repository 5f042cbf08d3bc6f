"""The scheduler: pure policy (snapshot, plugins, policies, cycle) and its I/O edge (service)."""
