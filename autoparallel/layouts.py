"""`LayoutTable`: many layouts as a struct of numpy arrays (one row per layout)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .specs.layout import RECOMPUTE_CODES, RECOMPUTE_NAMES, Layout, Recompute

COLUMNS = ("dp", "tp", "pp", "vp", "cp", "ep", "zero", "rc", "sp", "mb")
"""Column names; `rc` is the recompute code (0 none, 1 selective, 2 full), `sp` 0/1, `mb` the
micro-batch size."""


@dataclass(frozen=True)
class LayoutTable:
    """One row per candidate layout; every column is a 1-D int64 array of the same length."""

    columns: Mapping[str, np.ndarray]

    def __post_init__(self):
        lengths = {len(np.asarray(v)) for v in self.columns.values()}
        if set(self.columns) != set(COLUMNS) or len(lengths) > 1:
            raise ValueError(f"LayoutTable needs columns {COLUMNS} of equal length")

    def __len__(self) -> int:
        return len(self.columns["dp"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def take(self, index: np.ndarray) -> LayoutTable:
        """Rows at `index` (integer or boolean array)."""
        return LayoutTable({k: v[index] for k, v in self.columns.items()})

    def row(self, i: int) -> Layout:
        """Row i as a `Layout`."""
        c = {k: int(v[i]) for k, v in self.columns.items()}
        return Layout(
            dp=c["dp"], tp=c["tp"], pp=c["pp"], vp=c["vp"], cp=c["cp"], ep=c["ep"],
            zero=c["zero"], recompute=RECOMPUTE_NAMES[c["rc"]], sp=bool(c["sp"]),
            micro_batch=c["mb"],
        )

    @classmethod
    def from_layouts(cls, layouts: Sequence[Layout], n_gpus: int) -> LayoutTable:
        """Build a table from layouts; `dp` and `sp` are resolved against `n_gpus`."""
        rows = [lay.resolved(n_gpus) for lay in layouts]
        data = {
            "dp": [r.dp for r in rows], "tp": [r.tp for r in rows], "pp": [r.pp for r in rows],
            "vp": [r.vp for r in rows], "cp": [r.cp for r in rows], "ep": [r.ep for r in rows],
            "zero": [r.zero for r in rows],
            "rc": [RECOMPUTE_CODES[Recompute(r.recompute)] for r in rows],
            "sp": [int(bool(r.sp)) for r in rows], "mb": [r.micro_batch for r in rows],
        }
        return cls({k: np.asarray(v, dtype=np.int64) for k, v in data.items()})

    @classmethod
    def from_arrays(cls, **arrays) -> LayoutTable:
        """Build from keyword arrays (broadcast to a common length)."""
        b = np.broadcast_arrays(*(np.asarray(arrays[k], dtype=np.int64) for k in COLUMNS))
        return cls({k: np.ascontiguousarray(v) for k, v in zip(COLUMNS, b)})
