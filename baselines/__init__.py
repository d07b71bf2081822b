"""Baseline selectors; importing this package registers them by name."""
from baselines import fullkv, oracle  # noqa: F401
