"""Tabular outputs with a frozen column schema (plan `--format csv` and `sweep`)."""

from __future__ import annotations

import pandas as pd

from ..evaluate import MEMORY_KEYS, TIME_KEYS
from ..specs.job import JOB_FIELDS

PROBLEM_COLUMNS = ("model", "gpu", "n_gpus", "gpus_per_node", "seq_len", "global_batch") + JOB_FIELDS
"""The problem's numbers and every job setting (`JobSpec`), as `Problem.describe()` gives them."""
LAYOUT_COLUMNS = ("dp", "tp", "pp", "vp", "cp", "cp_comm", "cp_a2a", "ep", "etp", "edp", "zero",
                  "recompute", "sp", "micro_batch", "grad_accum", "layout")
"""`layout` is the full slug (`Layout.slug`: uneven split, schedule, block / uniform / named
recompute, offload), which `export --from` reads back; the other columns are its main axes."""
RESULT_COLUMNS = (
    ("rank", "problem_rows")
    + tuple(f"mem_{k}_gib" for k in MEMORY_KEYS)
    + ("mem_first_stage_gib", "mem_last_stage_gib")
    + tuple(f"time_{k}_s" for k in TIME_KEYS)
    + ("mfu", "tokens_per_s_per_gpu", "fits", "note")
)
SWEEP_COLUMNS = PROBLEM_COLUMNS + LAYOUT_COLUMNS + RESULT_COLUMNS
"""The frozen column schema of `sweep` CSVs and `plan --format csv` (`SWEEP_SCHEMA_VERSION`)."""
SWEEP_SCHEMA_VERSION = 6
"""Version 1: 42 columns. Version 2: + the job settings (stack, precision, grad_dtype, ...)
after the problem columns. Version 3: + `optimizer_dtype`; `usable_fraction` empty = the fitted
allocator margin; + mem_reserved_gib, mem_device_gib, mem_headroom_gib, mem_first_stage_gib,
mem_last_stage_gib. Version 4: + `model_code`, `torch_compile`, `autocast` (what the model's code
saves for backward) after `attention`; + time_offload_s (host-link transfers and CPU optimizer step of offloaded layouts)
after time_optimizer_s; + `layout` (the full slug) after grad_accum. Version 5: + `cp_comm`
(the context-parallel form, empty when cp = 1) and `cp_a2a` (the hierarchical form's all-to-all
group) after `cp`; + `etp`, `edp` (expert tensor- and data-parallel degrees, MoE parallel
folding) after `ep`; + the MoE job settings `moe_dispatcher`, `moe_a2a_overlap`, `moe_routing`,
`moe_capacity_factor`, `cuda_graphs` and `fp8_param_gather` after `tp_comm_overlap`; + `network`
(the network preset or file) before `profile`; + `time_host_s` after `time_offload_s`; +
`problem_rows` after `rank` (how many rows the problem has: `rank` runs 1..problem_rows, or one
'nothing fits' row), so that a resumed sweep keeps a problem only when all its rows are present.
Version 6: + `offload_modules` (fine-grained activation offload of MoE modules) after
`cuda_graphs`."""


def ranked_frame(result) -> pd.DataFrame:
    """One row per ranked layout (or one 'nothing fits' row), in `SWEEP_COLUMNS` order."""
    if len(result.ranked) == 0:
        row = {c: None for c in SWEEP_COLUMNS} | result.problem.describe()
        row["fits"] = False
        row["problem_rows"] = 1
        row["note"] = " ".join(result.nothing_fits_message().split())  # one line per row
        return pd.DataFrame([row], columns=list(SWEEP_COLUMNS))
    return rows_frame(result.problem, result.ranked)


def rows_frame(problem, ev) -> pd.DataFrame:
    """One row per layout of the evaluation `ev` (ranked, fastest first, at least one), in
    `SWEEP_COLUMNS` order."""
    problem = problem.describe()
    cols = ev.columns()
    cols["layout"] = [ev.table.row(i).slug for i in range(len(ev))]
    frame = pd.DataFrame({k: cols[k] for k in LAYOUT_COLUMNS + RESULT_COLUMNS if k in cols})
    frame.insert(0, "rank", range(1, len(ev) + 1))
    frame.insert(1, "problem_rows", len(ev))
    for k, v in reversed(problem.items()):
        frame.insert(0, k, v)
    frame["note"] = ""
    return frame[list(SWEEP_COLUMNS)]
