"""`LayoutTable`: many layouts as a struct of numpy arrays (one row per layout)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from .taken import Taken
from .specs.layout import (
    CP_COMM_CODES, CP_COMM_NAMES, RECOMPUTE_CODES, RECOMPUTE_NAMES, SCHEDULE_CODES,
    SCHEDULE_NAMES, CpComm, Layout, Recompute, default_schedule, mask_modules, modules_mask,
)

COLUMNS = ("dp", "tp", "pp", "vp", "cp", "ep", "etp", "zero", "rc", "sp", "mb", "lf", "ll", "sch",
           "rn", "rm", "ao", "oo", "cc", "cu")
"""Column names; `etp` the expert tensor-parallel degree (always explicit: tp where the layout
leaves it at Megatron's default; the expert data-parallel degree is tp x cp x dp / (etp x ep),
`edp`); `rc` is the recompute code (0 none, 1 selective, 2 full), `sp` 0/1, `mb` the
micro-batch size, `lf`/`ll` the transformer layers on the first/last pipeline stage (0 = the even
split; the middle stages share the rest equally), `sch` the schedule code (`SCHEDULE_CODES`),
`rn` the layers per model chunk that full recompute (rc = 2) recomputes, first ones first
(-1 = all of them; Megatron `--recompute-method block --recompute-num-layers`), or -N for all of
them in uniform checkpoint groups of N layers (Megatron `--recompute-method uniform
--recompute-num-layers N`; -1 = groups of one); `rm` the modules selective recompute (rc = 1)
re-runs as a bitmask (`specs.layout.MODULE_BITS`; 0 = the default, core_attn); `ao` the
transformer layers per pipeline stage whose activations are offloaded to the host; `oo` the
optimizer state offloaded to the host, percent; `cc` the context-parallel form code
(`specs.layout.CP_COMM_CODES`: 0 ring, 1 a2a, 2 allgather, 3 a2a+ring; 0 when cp = 1) and `cu`
the all-to-all group size of the hierarchical form (a2a+ring; 1 otherwise)."""
OPTIONAL_COLUMNS = ("etp", "lf", "ll", "sch", "rn", "rm", "ao", "oo", "cc", "cu")
"""Columns `from_arrays` fills when omitted: expert TP = TP, even split, default schedule for the
row's vp, every layer recomputed, default modules, nothing offloaded, ring context parallelism."""


def edp(t) -> np.ndarray:
    """Expert data-parallel degree of every row, tp x cp x dp / (etp x ep) (float; MoE Parallel
    Folding, arXiv 2504.14960: the expert grid ETP x EP x EDP covers the attention grid's
    TP x CP x DP ranks of each pipeline stage)."""
    grid = (t["tp"] * t["cp"] * t["dp"]).astype(np.float64)
    return grid / (t["etp"] * t["ep"])
ALL_LAYERS = -1
"""`rn` value: full recompute of every layer (`Layout.recompute_layers` None)."""


@dataclass(frozen=True)
class LayoutTable:
    """One row per candidate layout; every column is a 1-D int64 array of the same length."""

    columns: Mapping[str, np.ndarray]
    n_layers: int = 0
    """Transformer layers of the model: spells out the middle stages of an uneven split in
    `row` (0 = unknown; rows with an uneven split then need it)."""

    def __post_init__(self):
        if isinstance(self.columns, Taken):  # rows of a checked table (`take`)
            return
        lengths = {len(np.asarray(v)) for v in self.columns.values()}
        if set(self.columns) != set(COLUMNS) or len(lengths) > 1:
            raise ValueError(f"LayoutTable needs columns {COLUMNS} of equal length")

    def __len__(self) -> int:
        if isinstance(self.columns, Taken):
            return self.columns.n_rows
        return len(self.columns["dp"])

    def __getitem__(self, name: str) -> np.ndarray:
        return self.columns[name]

    def take(self, index) -> LayoutTable:
        """Rows at `index` (slice, integer or boolean array); the columns of an index are taken
        as they are read (`Taken`), a slice's are views."""
        if isinstance(index, slice) and not isinstance(self.columns, Taken):
            return LayoutTable({k: v[index] for k, v in self.columns.items()}, self.n_layers)
        if isinstance(index, slice):
            index = np.arange(len(self))[index]
        return LayoutTable(Taken(self.columns, index), self.n_layers)

    def row(self, i: int) -> Layout:
        """Row i as a `Layout`."""
        cols = self.columns
        if isinstance(cols, Taken):
            c = {k: int(cols.at(k, i)) for k in COLUMNS}
        else:
            c = {k: int(v[i]) for k, v in cols.items()}
        split = None
        if c["lf"] or c["ll"]:
            if not self.n_layers:
                raise ValueError("LayoutTable.row: an uneven split needs the table's n_layers")
            mid = [(self.n_layers - c["lf"] - c["ll"]) // max(c["pp"] - 2, 1)] * (c["pp"] - 2)
            split = [c["lf"], *mid, c["ll"]] if c["pp"] > 1 else None
        sch = SCHEDULE_NAMES[c["sch"]]
        return Layout(
            dp=c["dp"], tp=c["tp"], pp=c["pp"], vp=c["vp"], cp=c["cp"], ep=c["ep"],
            etp=None if c["etp"] == c["tp"] else c["etp"], zero=c["zero"], recompute=RECOMPUTE_NAMES[c["rc"]], sp=bool(c["sp"]),
            micro_batch=c["mb"], stage_layers=split,
            schedule=None if sch == default_schedule(c["vp"]) else sch,
            recompute_layers=None if c["rn"] < 0 or c["rc"] != 2 else c["rn"],
            recompute_group=-c["rn"] if c["rn"] < -1 and c["rc"] == 2 else None,
            recompute_modules=mask_modules(c["rm"]) if c["rc"] == 1 else None,
            offload_layers=c["ao"], optimizer_offload=c["oo"] / 100.0,
            cp_comm=CP_COMM_NAMES[c["cc"]] if c["cp"] > 1 else None,
            cp_a2a=c["cu"] if c["cp"] > 1 and c["cc"] == CP_COMM_CODES[CpComm.A2A_RING] else None,
        )


    @classmethod
    def from_layouts(cls, layouts: Sequence[Layout], n_gpus: int, n_layers: int = 0) -> LayoutTable:
        """Build a table from layouts; `dp` and `sp` are resolved against `n_gpus`."""
        rows = [lay.resolved(n_gpus) for lay in layouts]
        if not n_layers:
            n_layers = next((sum(r.stage_layers) for r in rows if r.stage_layers), 0)
        data = {
            "dp": [r.dp for r in rows], "tp": [r.tp for r in rows], "pp": [r.pp for r in rows],
            "vp": [r.vp for r in rows], "cp": [r.cp for r in rows], "ep": [r.ep for r in rows],
            "etp": [r.expert_tp for r in rows], "zero": [r.zero for r in rows],
            "rc": [RECOMPUTE_CODES[Recompute(r.recompute)] for r in rows],
            "sp": [int(bool(r.sp)) for r in rows], "mb": [r.micro_batch for r in rows],
            "lf": [r.stage_layers[0] if r.stage_layers else 0 for r in rows],
            "ll": [r.stage_layers[-1] if r.stage_layers else 0 for r in rows],
            "sch": [SCHEDULE_CODES[r.pipeline_schedule] for r in rows],
            "rn": [(-(r.recompute_group or 1)) if r.recompute_layers is None
                   else r.recompute_layers for r in rows],
            "rm": [modules_mask(r.recompute_modules) for r in rows],
            "ao": [r.offload_layers for r in rows],
            "oo": [round(r.optimizer_offload * 100) for r in rows],
            "cc": [CP_COMM_CODES[r.cp_form] for r in rows],
            "cu": [r.cp_a2a or 1 for r in rows],
        }
        return cls({k: np.asarray(v, dtype=np.int64) for k, v in data.items()}, n_layers)

    @classmethod
    def from_arrays(cls, n_layers: int = 0, **arrays) -> LayoutTable:
        """Build from keyword arrays (broadcast to a common length); `etp` defaults to `tp`
        (Megatron's expert TP), `lf`, `ll` to 0 (even split), `sch` to the default schedule of
        each row's vp, `rn` to all layers, `rm`, `ao`, `oo` to 0 (default modules, no offload),
        `cc` to 0 and `cu` to 1 (ring)."""
        arrays = dict(arrays)
        arrays.setdefault("etp", arrays.get("tp", 1))
        arrays.setdefault("lf", 0)
        arrays.setdefault("ll", 0)
        arrays.setdefault("rn", ALL_LAYERS)
        for k in ("rm", "ao", "oo", "cc"):
            arrays.setdefault(k, 0)
        arrays.setdefault("cu", 1)
        if "sch" not in arrays:
            arrays["sch"] = np.where(np.asarray(arrays["vp"]) > 1, 1, 0)
        b = np.broadcast_arrays(*(np.asarray(arrays[k], dtype=np.int64) for k in COLUMNS))
        return cls({k: np.ascontiguousarray(v) for k, v in zip(COLUMNS, b)}, n_layers)
