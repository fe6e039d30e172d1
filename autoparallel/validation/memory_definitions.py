"""Which memory figure a measured run reports: its `mem_definition` text read as `allocated`
(`torch.cuda.max_memory_allocated`), `reserved` (`max_memory_reserved`, TorchTitan's printed
memory) or `device` (`nvidia-smi`; FlagPerf's monitor samples nvidia-smi), and the key of the
evaluation's memory dict each one is compared with. Shared by the run mapping (`runs`), the
memory check (`memory_check`) and the report."""

from __future__ import annotations

import re

FIGURE = {"allocated": "total", "reserved": "reserved", "device": "device"}
"""Memory definition -> key of the evaluation's memory dict."""


def definition(text: str, status: str) -> str | None:
    """`allocated`, `reserved`, `device` or None (not stated) from a row's `mem_definition`."""
    t = (text or "").lower()
    if "oom" in (status or "").lower() and not t.strip():
        return None
    if "max_memory_allocated" in t or "peak allocated" in t:
        return "allocated"
    if "reserved" in t:
        return "reserved"
    if re.search(r"nvidia-smi|flagperf|gpu memory usage", t):
        return "device"
    return None


def stage(text: str) -> str:
    """Which pipeline stage's figure a row reports: `first` where its `mem_definition` says the
    figure is global rank 0's (DeepSpeed's `PipeTopology` and Megatron both put rank 0 in the
    first stage), else `peak` (the most loaded stage, what a plan checks)."""
    return "first" if re.search(r"\brank 0\b", (text or "").lower()) else "peak"


def figure_key(kind: str, text: str) -> str:
    """Key of the evaluation's memory dict for a row's definition `kind` and stage (`stage`)."""
    if stage(text) == "first":
        return "first." + ("allocated" if FIGURE[kind] == "total" else FIGURE[kind])
    return FIGURE[kind]
