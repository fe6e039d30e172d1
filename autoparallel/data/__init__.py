"""Measured-run tables the project validates and calibrates on, shipped with the package so that
`validate`, `calibrate` and `benchmarks/validate.py` work from a fresh install. Their README (this
folder) lists every source; nothing in them was measured by this project."""

from importlib import resources
from pathlib import Path


def data_path(name: str) -> Path:
    """Path of a shipped data file (`published_runs.csv`, `memory_runs.csv`,
    `megatron_bridge_recipes.csv`, `error_bands.csv`)."""
    return Path(str(resources.files(__package__) / name))


PUBLISHED_RUNS = data_path("published_runs.csv")
MEMORY_RUNS = data_path("memory_runs.csv")
"""648 published training runs with their measured speed (and some memory)."""
MEMORY_RUNS = data_path("memory_runs.csv")
"""107 runs with measured per-GPU memory."""
