"""Launchers turn attempts into running workers, and workers' fates into attempt outcomes."""
