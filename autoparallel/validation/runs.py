"""Measured runs (the columns of shared/data/published_runs.csv) -> `RunCase`s.

A usable row is BF16, dense or MoE, on a GPU with a preset, with a complete layout and a
measured step time (directly, or via a throughput). Everything else is skipped with a reason
that the report counts. What a row leaves open is derived from what it does say, and each such
derivation is recorded as an assumption:

- `dp` = num_gpus / (tp x pp x cp) (Megatron convention, EP carved out of DP x CP); pure-FSDP rows
  without tp/pp are tp = pp = 1;
- ZeRO: `zero_stage` if given; FSDP FULL_SHARD / FSDP2 -> 3; SHARD_GRAD_OP -> 2; Megatron
  distributed optimizer (or `--overlap-param-gather` in the notes) -> 1; otherwise 1 (assumed);
- micro-batch: `mbs`, else gbs / (dp x grad_accum), else 1 (assumed);
- recompute: the row's word (full / selective / none); when not stated, the least recompute that
  the memory model says fits in the GPU's memory (none, then selective, then full) (assumed);
- precision: the row's recipe (bf16, fp8 per-tensor, MXFP8, NVFP4, ...; FP16 only with
  `--include-fp16`) (counted);
- software stack: the stack preset whose `frameworks` patterns match the row's `framework`
  (counted); the stack gives the gradient dtypes, the attention kernel per GPU generation, the
  TP-overlap default and the efficiency profile; a row overrides what it states (llm-foundry
  "PURE" bf16 reduces gradients in bf16; "async TP" / "vanilla TP"; `--tp-comm-overlap`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from ..cost.model_arch import build_arch
from ..csv_input import read_csv_strings
from ..errors import AutoParallelError, SpecError
from ..evaluate import evaluate
from ..layouts import LayoutTable
from ..presets import load_gpu
from ..problem import make_problem
from ..rules import active_rules, check_rules, reasons
from ..specs.hardware import Profile
from ..specs.layout import Layout
from ..specs.model import ModelSpec
from ..specs.problem import Problem
from ..units import GB, GiB
from .conventions import measured_step_s
from .memory_definitions import definition
from .derive import (_job_overrides, _layout, _precision, _recompute, _stack, _zero, gpu_preset,
                     SETTING_FIELDS, moe_settings, network_gbps)
from .modelspec import RowSkip, _int, _num, model_from_row
from .recipes import match as recipe_match

REQUIRED_COLUMNS = ("gpu", "num_gpus", "seq_len", "gbs", "layers", "hidden", "heads", "vocab",
                    "precision")
"""Columns a runs file must have (others are optional)."""
MEASURE_COLUMNS = ("iteration_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu", "mfu_pct")
"""At least one of these must be present."""
RELAXED_RULES = ("layers", "tp_in_node")
"""Planner rules a run that ran has already disproved for itself: uneven pipeline stages (BLOOM's
70 layers on pp 12, DeepSeek-V3's 61 on pp 4) and TP across nodes are possible, only unusual."""
RULES = active_rules(disabled=RELAXED_RULES)


@dataclass(frozen=True)
class RunCase:
    """One usable measured run: what ran (problem + layout) and what was measured."""

    row_id: str
    source: str
    gpu: str
    model: ModelSpec
    n_gpus: int
    gpus_per_node: int
    seq_len: int
    global_batch: int
    layout: Layout
    measured_step_s: float
    measured_from: str
    job: dict = field(default_factory=dict)
    """Job settings (`JobSpec` fields) the run states; the others are its stack's defaults."""
    measured_mem_gib: float | None = None
    mem_definition: str = "allocated"
    """Which figure the measured memory is: `allocated`, `reserved` or `device` (`memory_check`)."""
    assumptions: tuple[str, ...] = field(default_factory=tuple)

    def problem(self, profile: Profile | None = None) -> Problem:
        """The `Problem` of this run, with `profile` (default: its stack's on its GPU)."""
        extra = {} if profile is None else {"profile": profile}
        return make_problem(self.model, self.gpu, self.n_gpus, self.seq_len, self.global_batch,
                            gpus_per_node=self.gpus_per_node, **self.job, **extra)

    @property
    def stack(self) -> str:
        """The run's software stack preset."""
        return self.job.get("stack", "megatron-core")

    @property
    def precision(self) -> str:
        """The run's precision recipe."""
        return self.job.get("precision", "bf16")

    @property
    def grad_dtype(self) -> str:
        """Gradient buffer dtype as the cost model uses it (stated or the stack's)."""
        return self.problem().training.grad_dtype

    def table(self) -> LayoutTable:
        """The one-row layout table."""
        return LayoutTable.from_layouts([self.layout], self.n_gpus)


def _least_recompute_that_fits(problem: Problem, lay: dict) -> str:
    """The least recompute (none, selective, full) whose most-loaded stage fits in the GPU's
    memory: the run ran, so it fit the device (the planner's usable-fraction margin is a safety
    margin for plans, not a fact about a run that happened)."""
    layouts = [Layout(**lay, recompute=r) for r in ("none", "selective", "full")]
    ev = evaluate(problem, LayoutTable.from_layouts(layouts, problem.cluster.n_gpus,
                                                    problem.model.n_layers), RULES)
    fitting = np.flatnonzero(ev.memory["total"] <= ev.memory["capacity"])
    return layouts[int(fitting[0]) if len(fitting) else 2].recompute.value


SOURCE_MEMORY_DEFINITIONS = {"nanotron_playbook_2025": "reserved"}
"""Sources whose memory figure is named by their code, not their text: nanotron's per-step log
carries one peak figure, `cuda_max_memory_reserved` (huggingface/nanotron src/nanotron/trainer.py,
the `LogItem`s of each training step), which the Ultra-Scale Playbook's heatmap shows."""


def _mem_definition(row) -> str:
    """`allocated` (the default: `torch.cuda.max_memory_allocated`), `reserved` or `device`."""
    src = str(row.get("source_key") or "")
    if src in SOURCE_MEMORY_DEFINITIONS:
        return SOURCE_MEMORY_DEFINITIONS[src]
    text = str(row.get("mem_definition") or "")
    found = definition(text, str(row.get("run_status") or ""))
    if found is None and "torchtitan" in f"{text} {row.get('framework') or ''}".lower():
        return "reserved"  # TorchTitan prints max_memory_reserved (memory_runs.md)
    return found or "allocated"


BINARY_UNIT = re.compile(r"gib|mib|2\^20|/ ?1024", re.I)
"""Words of a row's `mem_definition` or `derived_values` that put its `peak_mem_gb` in GiB: a
figure printed in GiB, or in MiB (`max_memory_allocated() / 2^20`, ATorch's and Colossal-AI's
"MB") and divided by 1024 (e.g. "peak_mem_gb = 31132.3 MiB / 1024 derived"); else decimal GB."""


def _mem_gib(row) -> float | None:
    """The row's measured memory in GiB (`peak_mem_gb` in the unit `BINARY_UNIT` reads)."""
    v = _num(row, "peak_mem_gb")
    if not v:
        return None
    unit = f"{row.get('mem_definition') or ''} {row.get('derived_values') or ''}"
    return v if BINARY_UNIT.search(unit) else v * GB / GiB


CP_FORM_WORDS = (("a2a+p2p", "a2a+ring"), ("ulysses", "a2a"), ("cp_comm_type a2a", "a2a"),
                 ("all_gather", "allgather"), ("allgather", "allgather"), ("p2p", "ring"))
"""Words in a row's `notes` that name its context-parallel form (Megatron-Core --cp-comm-type
values, DeepSpeed-Ulysses), first match wins."""


def cp_form_of(row, stack, assumptions: list[str]) -> str:
    """The context-parallel form of a cp > 1 run: what its notes name (`CP_FORM_WORDS`), else
    its stack's default (`StackSpec.cp_comm`, first; ring for a stack without one), counted as an
    assumption."""
    notes = str(row.get("notes") or "").lower()
    for word, form in CP_FORM_WORDS:
        if word in notes:
            return form
    form = stack.cp_comm[0] if stack.cp_comm else "ring"
    assumptions.append(f"CP form not stated: {form} (the stack's default)")
    return form


KNOWN_REGRESSION = "known performance regression"
"""Words in a row's notes for a figure its own source marks as a regression to be fixed (the
Megatron-Bridge 26.06.01 GPT-OSS 120B rows, footnote `gpt-oss-note`: cudnn-frontend #256,
"resolved with the next container release"; the same layouts run 1.6x faster in 26.06 and
26.08): not the stack's speed, so neither scored nor fitted."""


def case_from_row(row, allow_fp16: bool = False, memory: bool = False) -> RunCase:
    """One row -> `RunCase`; raises `RowSkip` with the counted reason. `memory`: a memory check
    (OOM reports kept, no step time needed: `measured_step_s` is NaN when the row has none)."""
    workload = str(row.get("workload") or "").lower()
    if "lora" in workload:
        raise RowSkip("LoRA fine-tuning (not modelled)")
    if KNOWN_REGRESSION in str(row.get("notes") or "").lower():
        raise RowSkip("the source marks the figure a known performance regression")
    status = str(row.get("run_status") or "ok").strip().lower()
    if status not in ("ok", "", "nan") and not (memory and status == "oom"):
        raise RowSkip(f"run_status {status}")
    gpu = gpu_preset(str(row.get("gpu") or ""))
    model, assumptions = model_from_row(row)
    precision = _precision(row, allow_fp16, assumptions, memory=memory)
    stack = _stack(row, assumptions)
    job = {"stack": stack, "precision": precision} | _job_overrides(row, stack)
    n_gpus, seq, gbs = _int(row, "num_gpus"), _int(row, "seq_len"), _int(row, "gbs")
    if not (n_gpus and seq and gbs):
        raise RowSkip("num_gpus, seq_len or gbs missing")
    gpn = _int(row, "gpus_per_node")
    if not gpn:
        node = load_gpu(gpu).gpus_per_node
        gpn = min(node, n_gpus)
        assumptions.append(f"gpus_per_node not stated: {node} (the GPU's node)")
    net = network_gbps(row, gpn)
    if net is not None and n_gpus > gpn:
        preset = load_gpu(gpu).nic_gbit_per_s / 8.0
        if abs(net - preset) > 1e-6 * preset:
            job["inter_gbps"] = net
            assumptions.append(f"network as the source states it: {net:g} GB/s per GPU "
                               f"({gpu} preset {preset:g})")
    zero = _zero(row, assumptions)
    lay = _layout(row, n_gpus, gbs, zero, assumptions)
    # a blank arch_type counts as MoE for the hybrid presets only (their rows print no type)
    moe_job, moe_lay, moe_modules = moe_settings(
        row, assumptions, is_moe=model.moe is not None and model.layers is not None)
    job |= moe_job
    lay |= moe_lay
    if "zero" in moe_lay:  # the launch config's ZeRO stage, not the unstated default
        assumptions[:] = [a for a in assumptions if not a.startswith("ZeRO stage not stated")]
    if model.moe is not None and "etp" not in lay and lay["tp"] > 1 and \
            (lay["dp"] * lay["cp"]) % lay["ep"]:
        # EP beyond DP x CP runs only folded (ETP x EP x EDP = TP x CP x DP): with expert TP 1
        lay["etp"] = 1
        assumptions.append("ep > dp x cp: expert TP 1 (parallel folding)")
    found_recipe = recipe_match(row, gpu, lay)
    if found_recipe is not None:
        # what the published recipe ran beyond the table's layout (`validation.recipes`)
        assumptions.append(found_recipe.assumption())
        if found_recipe.offload_layers and not lay.get("offload_layers"):
            lay["offload_layers"] = found_recipe.offload_layers
        if found_recipe.tp_comm_overlap is not None and "tp_comm_overlap" not in job:
            job["tp_comm_overlap"] = found_recipe.tp_comm_overlap
    arch = build_arch(model)
    step, how = measured_step_s(row, arch, n_gpus, seq, gbs)
    if step is None and memory:
        step, how = float("nan"), "no step time (memory check)"
    elif step is None:
        raise RowSkip(how)
    try:
        problem = make_problem(model, gpu, n_gpus, seq, gbs, gpus_per_node=gpn, **job)
    except AutoParallelError as exc:
        raise RowSkip("problem invalid: " + str(exc).splitlines()[0]) from None
    if lay["cp"] > 1:
        lay["cp_comm"] = cp_form_of(row, problem.stack, assumptions)
    if lay.get("sp") is None and lay["tp"] > 1 and not problem.stack.sequence_parallel:
        lay["sp"] = False  # the stack has no sequence parallelism
    if model.n_layers % (lay["pp"] * lay["vp"]) and lay["pp"] > 1:
        # the uneven split the planner would propose (first/last stages lighter, Megatron-Core's
        # --decoder-first/last-pipeline-num-layers) instead of fractional layers per stage; set
        # before the recompute is inferred, which depends on the most loaded stage
        from ..splits import default_split

        split = default_split(arch, seq, lay["pp"], lay["vp"])
        if split:
            lay["stage_layers"] = split
    rc = _recompute(row, assumptions)
    if rc is None and moe_modules:  # the launch config's named recompute modules
        rc, lay["recompute_modules"] = "selective", moe_modules
    elif rc is None and found_recipe is not None and found_recipe.recompute is not None:
        rc = found_recipe.recompute
        if found_recipe.recompute_layers:
            lay["recompute_layers"] = found_recipe.recompute_layers
        if found_recipe.recompute_modules:
            lay["recompute_modules"] = found_recipe.recompute_modules
    elif rc is None and problem.stack.unstated_recompute == "none" and model.moe is None:
        rc = "none"
        assumptions.append(f"recompute not stated: none (the {stack} recipes' default)")
    elif rc is None:
        rc = _least_recompute_that_fits(problem, lay)
        assumptions.append(f"recompute not stated: {rc} (least that fits)")
    layout = Layout(**lay, recompute=rc)
    table = LayoutTable.from_layouts([layout], n_gpus, model.n_layers)
    # the rules alone (no ledger): whether the row's memory fits is the prediction's to say
    broken = int(check_rules(problem, build_arch(model), table, RULES)[0])
    if broken:
        raise RowSkip("layout breaks a rule (" + ", ".join(reasons(broken)) + ")")
    if layout.stage_layers:
        assumptions.append(f"uneven pipeline stages: {layout.stage_layers} (balanced split)")
    elif model.n_layers % (layout.pp * layout.vp):
        assumptions.append("uneven pipeline stages (layers / (pp x vp) not whole)")
    return RunCase(
        row_id=str(row.get("row_id") or ""), source=str(row.get("source_key") or "runs"),
        gpu=gpu, model=model, n_gpus=n_gpus, gpus_per_node=gpn, seq_len=seq, global_batch=gbs,
        layout=layout, measured_step_s=float(step), measured_from=how, job=job,
        measured_mem_gib=_mem_gib(row), mem_definition=_mem_definition(row),
        assumptions=tuple(assumptions),
    )


SETTINGS_FILE = "moe_settings.csv"
"""Side table next to a runs CSV: `row_id, field, value, source` rows with the settings a run
states elsewhere than in its row (`derive.SETTING_FIELDS`)."""


def read_settings(path) -> pd.DataFrame | None:
    """The side table of settings (`SETTINGS_FILE`), one column `setting_<field>` per field
    indexed by row_id, plus `setting_sources`; None when the file does not exist."""
    from pathlib import Path

    path = Path(path)
    if not path.exists():
        return None
    table = read_csv_strings(path, str(path))
    missing = {"row_id", "field", "value", "source"} - set(table.columns)
    if missing:
        raise SpecError(f"{path}: missing column(s) {', '.join(sorted(missing))}; a settings table "
                        "has row_id, field, value, source")
    unknown = sorted(set(table["field"]) - set(SETTING_FIELDS))
    if unknown:
        raise SpecError(f"{path}: unknown field(s) {', '.join(unknown)}; known: "
                        f"{', '.join(SETTING_FIELDS)}")
    wide = table.pivot_table(index="row_id", columns="field", values="value", aggfunc="last")
    wide.columns = [f"setting_{c}" for c in wide.columns]
    wide["setting_sources"] = table.groupby("row_id")["source"].agg(lambda s: "; ".join(sorted(set(s))))
    return wide


def read_runs(path, settings="auto", flag: str = "--runs") -> pd.DataFrame:
    """Read a runs CSV; reject the file (SpecError, naming the option `flag` that gave it) when
    it is unreadable or lacks columns. `settings`: a side table of further settings per row
    (`SETTINGS_FILE`); "auto" reads the one next to the runs file when there is one, None reads
    none."""
    frame = read_csv_strings(path, f"{flag} {path}")
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise SpecError(f"{flag} {path}: missing column(s) {', '.join(missing)}; a runs file needs "
                        f"{', '.join(REQUIRED_COLUMNS)} and one of {', '.join(MEASURE_COLUMNS)} "
                        "(autoparallel/data/README.md says what each column means)")
    if not any(c in frame.columns for c in MEASURE_COLUMNS):
        raise SpecError(f"{flag} {path}: no measurement column; give one of "
                        f"{', '.join(MEASURE_COLUMNS)}")
    if "row_id" not in frame.columns:
        frame["row_id"] = [f"row{i + 1}" for i in range(len(frame))]
    if settings == "auto":
        from pathlib import Path

        settings = Path(path).with_name(SETTINGS_FILE)
    wide = read_settings(settings) if settings is not None else None
    if wide is not None:
        frame = frame.merge(wide, how="left", left_on="row_id", right_index=True)
        frame = frame.fillna("")
    return frame


def load_cases(frame: pd.DataFrame, allow_fp16: bool = False):
    """(cases, skipped) where skipped is a DataFrame of row_id, source, reason."""
    cases, skipped = [], []
    for rec in frame.to_dict("records"):
        rec = {k: (None if v == "" else v) for k, v in rec.items()}
        try:
            cases.append(case_from_row(rec, allow_fp16))
        except RowSkip as exc:
            skipped.append((rec.get("row_id"), rec.get("source_key") or "runs", str(exc)))
        except (AutoParallelError, ValueError) as exc:  # a spec the row implies is invalid
            skipped.append((rec.get("row_id"), rec.get("source_key") or "runs",
                            "invalid row: " + str(exc).splitlines()[0][:80]))
    return cases, pd.DataFrame(skipped, columns=["row_id", "source", "reason"])
