"""What NVIDIA's Megatron-Bridge performance recipes ran beyond the layout their tables print.

The Megatron-Bridge performance summaries (`docs/performance-summary*.md`, the
`megatron_bridge_perf` rows of published_runs.csv) give GPUs, precision, batch and the parallel
degrees, but not the recompute, CPU activation offloading, CUDA graphs or TP-overlap setting of
the recipe that produced each row. `autoparallel/data/megatron_bridge_recipes.csv` holds those
settings, release by release, as the recipes state them (`benchmarks/megatron_bridge_recipes.py`
reads them from the project's git history: `scripts/performance/configs/**/
*workload_base_configs.py`, the 25.09 YAML perf matrices). A row takes the settings of the recipe
whose layout it matches exactly (GPU, precision, task, GPUs, TP/PP/CP/VP/EP, micro and global
batch), from the release nearest to the row's NeMo container; a row no recipe matches keeps
its stack's defaults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

import pandas as pd

from ..data import data_path
from ..specs.layout import RecomputeModule

RECIPES_FILE = "megatron_bridge_recipes.csv"

RELEASES = ("v0.1.0rc4", "v0.2.0", "v0.2.2", "v0.3.0", "v0.3.1", "v0.4.0", "v0.4.1", "v0.4.2",
            "v0.5.0", "v0.5.1")
"""Megatron-Bridge releases in the table, oldest first."""

CONTAINER_RELEASE = {"25.09": "v0.1.0rc4", "25.11": "v0.2.2", "26.02": "v0.3.0",
                     "26.02.01": "v0.4.0", "26.04": "v0.4.1", "26.04.01": "v0.4.2",
                     "26.06": "v0.5.0", "26.06.01": "v0.5.1", "26.08": "v0.5.1"}
"""NeMo container of a table -> the release whose `docs/performance-summary.md` first lists it
(v0.2.2 lists 25.11, v0.3.0 26.02, v0.4.0 26.02.01, v0.4.2 26.04.01, v0.5.0 26.06; 25.09 is the
v0.1.0rc4 YAML matrices; 26.04 falls between v0.4.0 and v0.4.2). 26.08's recipes (v0.6.0) are
Python functions, not tables: the nearest table is used."""

PRECISIONS = (("nvfp4", "NVFP4"), ("mxfp8", "FP8_MX"), ("fp8-mx", "FP8_MX"), ("fp8", "FP8_CS"),
              ("bf16", "BF16"))
"""Row precision text -> recipe precision (the tables' plain "FP8" is current scaling, FP8-CS)."""

UNSTATED_RECOMPUTE_NONE = ("LLAMA",)
"""Model families whose base recipes set no recompute (`recompute_granularity = None` in
`megatron/bridge/recipes/llama/*`), so a matched recipe without `recompute_num_layers` /
`recompute_modules` ran none; other families' base recipes set their own."""


@dataclass(frozen=True)
class RecipeMatch:
    """The recipe a row was run with, and what it sets that the row does not state."""

    config: str
    release: str
    recompute: str | None
    """`none`, `selective` or `full`, or None when the recipe leaves it to the base recipe."""
    recompute_layers: int | None
    recompute_modules: list[str] | None
    offload_layers: int
    cuda_graphs: bool | None
    tp_comm_overlap: bool | None

    def assumption(self) -> str:
        parts = []
        if self.recompute is not None:
            rc = self.recompute + (f" (first {self.recompute_layers} layers)"
                                   if self.recompute_layers else "")
            rc += f" ({'+'.join(self.recompute_modules)})" if self.recompute_modules else ""
            parts.append(f"recompute {rc}")
        if self.offload_layers:
            parts.append(f"activation offload {self.offload_layers} layers")
        if self.cuda_graphs is not None:
            parts.append(f"CUDA graphs {'on' if self.cuda_graphs else 'off'}")
        if self.tp_comm_overlap is False:
            parts.append("TP overlap off")
        # the release, not the config name, so that the validate report counts settings (the
        # table row is found again by the run's layout)
        return f"Megatron-Bridge recipe ({self.release}): " + (", ".join(parts) or "the stack's defaults")


@lru_cache(maxsize=1)
def recipes() -> pd.DataFrame:
    """The shipped recipe table."""
    return pd.read_csv(data_path(RECIPES_FILE), dtype=str, keep_default_na=False)


MATCHED_COLUMNS = ("tp", "pp", "cp", "vp", "ep", "mbs", "gbs", "num_gpus")
"""The recipe table's layout and size columns a run must equal (`match`)."""


@lru_cache(maxsize=1)
def _indexed() -> pd.DataFrame:
    """The recipe table with its model keys (`_key`) and the `MATCHED_COLUMNS` as integers,
    derived once rather than for every run matched."""
    table = recipes().copy()
    table["_model_key"] = table["model"].map(_key)
    for col in MATCHED_COLUMNS:
        table[f"_{col}"] = table[col].map(_int)
    return table


def _key(text: str) -> str:
    """Model names compared without case, punctuation or a parenthesised variant."""
    return re.sub(r"[^A-Z0-9]", "", re.sub(r"\(.*?\)", "", str(text)).upper())


def _precision(text: str) -> str | None:
    t = str(text).lower()
    return next((name for word, name in PRECISIONS if word in t), None)


def _int(value) -> int | None:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return None


def _bool(value) -> bool | None:
    v = str(value).strip().lower()
    return {"true": True, "false": False}.get(v)


def match(row, gpu: str, layout: dict) -> RecipeMatch | None:
    """The recipe whose layout `row` (a published_runs.csv record on preset `gpu`) matches, or
    None. `layout` is the row's derived layout (tp, pp, cp, vp, ep, micro_batch)."""
    fw = str(row.get("framework") or "")
    m = re.search(r"NeMo (\d\d\.\d\d(?:\.\d\d)?)", fw)
    if "megatron-bridge" not in fw.lower() or not m:
        return None
    table = _indexed()
    prec = _precision(row.get("precision"))
    task = {"sft": "SFT", "lora": "LORA"}.get(str(row.get("workload") or "").strip().lower(),
                                              "PRETRAIN")
    want = {"tp": layout["tp"], "pp": layout["pp"], "cp": layout["cp"], "vp": layout["vp"],
            "ep": layout["ep"], "mbs": layout["micro_batch"], "gbs": _int(row.get("gbs")),
            "num_gpus": _int(row.get("num_gpus"))}
    keep = ((table["_model_key"] == _key(row.get("model"))) & (table["gpu"] == gpu.upper())
            & (table["precision"] == prec) & (table["task"] == task))
    for col, value in want.items():
        keep &= table[f"_{col}"] == value
    same = table[keep]
    if not len(same):
        return None
    target = RELEASES.index(CONTAINER_RELEASE.get(m.group(1), RELEASES[-1]))

    def distance(r) -> tuple:
        lo, hi = RELEASES.index(r["first_tag"]), RELEASES.index(r["last_tag"])
        return (0 if lo <= target <= hi else min(abs(lo - target), abs(hi - target)), -hi)

    best = min(same.to_dict("records"), key=distance)
    layers = _int(best["recompute_num_layers"])
    known = {m.value for m in RecomputeModule}
    modules = [m for m in best["recompute_modules"].split("+") if m in known] or None
    if layers:
        recompute = "full"
    elif modules:
        recompute = "selective"
    elif any(best["model"].startswith(f) for f in UNSTATED_RECOMPUTE_NONE):
        recompute = "none"
    else:
        recompute = None
    impl = best["cuda_graph_impl"].strip().lower()
    return RecipeMatch(
        config=best["config"], release=best["first_tag"] if distance(best)[0] else
        RELEASES[target], recompute=recompute, recompute_layers=layers,
        recompute_modules=modules, offload_layers=_int(best["cpu_offloading_num_layers"]) or 0,
        cuda_graphs=None if not impl else impl != "none",
        tp_comm_overlap=_bool(best["tp_comm_overlap"]))
