"""Score a `LayoutTable` against a `Problem`: rules, memory ledger, time ledger, MFU.

`evaluate` is the one code path; `estimate` runs it on a one-row table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from .bands import COMM_ITEMS, Bands, bands_for
from .cost.arch import Arch
from .cost.model_arch import build_arch
from .cost.memory import MEMORY_ITEMS, STAGE_FIGURES, memory_ledger
from .cost.time import TIME_ITEMS, time_ledger
from .errors import SpecError
from .layouts import LayoutTable, edp
from .rules import (Reject, check_rules, chunk_layers, counts_beyond_layers, explain,
                    split_violated)
from .cost.stages import stage_layer_counts
from .specs.layout import (CP_COMM_CODES, CP_COMM_NAMES, RECOMPUTE_NAMES, SCHEDULE_NAMES, CpComm,
                           Layout, RecomputeModule, mask_modules)
from .specs.problem import Problem
from .taken import Taken
from .units import GiB, TFLOPS

MEMORY_KEYS = (
    "params", "grads", "optimizer", "model_states", "activations", "embedding_logits",
    "overhead", "total", "capacity", "usable", "reserved", "device", "headroom",
)
"""Keys of `memory_gib` in the estimate JSON, in order (`by_stage` follows them)."""
STAGE_KEYS = MEMORY_ITEMS + STAGE_FIGURES
"""Keys of each `memory_gib.by_stage` entry besides `stage` and `pp_ranks`."""
TIME_KEYS = TIME_ITEMS + ("step",)
"""Keys of `time_s` in the estimate JSON, in order."""
LAYOUT_KEYS = ("dp", "tp", "pp", "vp", "cp", "ep", "etp", "edp", "zero", "recompute", "sp",
               "micro_batch", "grad_accum", "stage_layers", "schedule")
_A2A_RING = CP_COMM_CODES[CpComm.A2A_RING]


def cp_form_columns(t) -> tuple[np.ndarray, np.ndarray]:
    """(`cp_comm`, `cp_a2a`) of every row: the context-parallel form's name (None when cp = 1)
    and the all-to-all group of the hierarchical form (None otherwise), as the estimate JSON,
    the CSV columns and the slug give them."""
    cp, cc, cu = t["cp"], t["cc"], t["cu"]
    names = np.array([CP_COMM_NAMES[int(c)].value if p > 1 else None for c, p in zip(cc, cp)],
                     dtype=object)
    a2a = np.array([int(u) if p > 1 and c == _A2A_RING else None for c, p, u in zip(cc, cp, cu)],
                   dtype=object)
    return names, a2a


class Ledger(Mapping):
    """A ledger's arrays (`memory_ledger`, `time_ledger`) for the rows of `table`, of which only
    the keys in `kept` were retained when it ran over every row; any other key is costed when
    first read, over these rows (or, through `Taken`, over the rows taken), with every key kept
    from then on. A plan costs a million layouts and shows ten: it ranks on a few arrays and
    reads the breakdown of the rows it shows, so the hundred others are never stored for the
    million (the same numbers either way: a ledger costs each row on its own)."""

    __slots__ = ("_ledger", "_problem", "_arch", "_table", "_kept", "_keys")

    def __init__(self, ledger, problem: Problem, arch: Arch, table: LayoutTable,
                 kept: dict[str, np.ndarray], keys: tuple[str, ...]):
        self._ledger, self._problem, self._arch, self._table = ledger, problem, arch, table
        self._kept, self._keys = kept, keys

    def holds(self, key: str) -> bool:
        """Whether `key` is stored for every row."""
        return key in self._kept

    def of_rows(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """Every key of the ledger for the rows at `index`, costed now."""
        return in_blocks(self._ledger, self._problem, self._arch, self._table.take(index))

    def __getitem__(self, key: str) -> np.ndarray:
        if key not in self._kept:
            if key not in self._keys:
                raise KeyError(key)
            self._kept.update(in_blocks(self._ledger, self._problem, self._arch, self._table))
        return self._kept[key]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __reduce__(self):  # pickled as the plain dict it stands for
        return dict, (dict(self.items()),)


@dataclass(frozen=True)
class Evaluation:
    """Costs of every row of a layout table (arrays in bytes and seconds)."""

    problem: Problem
    arch: Arch
    table: LayoutTable
    reject: np.ndarray
    memory: dict[str, np.ndarray]
    time: dict[str, np.ndarray]
    mfu: np.ndarray
    tokens_per_s_per_gpu: np.ndarray
    model_flops_per_step: float

    def __len__(self) -> int:
        return len(self.table)

    @property
    def fits(self) -> np.ndarray:
        """Rows whose most-loaded stage fits in usable memory (`fit_peak <= usable`,
        `cost.memory.memory_ledger`)."""
        return self.memory["fit_peak"] <= self.memory["usable"]

    @property
    def valid(self) -> np.ndarray:
        """Rows that pass every rule except memory."""
        return (self.reject & ~int(Reject.OOM)) == 0

    def take(self, index) -> Evaluation:
        """The rows at `index` (the ledger arrays taken as they are read: `Taken`)."""
        index = np.arange(len(self))[index]  # a slice or mask as row numbers, for `Taken`
        return Evaluation(
            problem=self.problem, arch=self.arch, table=self.table.take(index),
            reject=self.reject[index], memory=Taken(self.memory, index),
            time=Taken(self.time, index), mfu=self.mfu[index],
            tokens_per_s_per_gpu=self.tokens_per_s_per_gpu[index],
            model_flops_per_step=self.model_flops_per_step,
        )

    def bands(self) -> Bands:
        """Error bands of every row, from leave-one-source-out validation residuals
        (`autoparallel.bands`)."""
        return bands_for(self.problem, self.time, self.memory["total"])

    def record(self, i: int, bands: Bands | None = None) -> dict:
        """Row i in the estimate JSON schema (GiB = 2^30 bytes, seconds), with its error band
        (`bands`: precomputed for every row, else computed for this one)."""
        if bands is None:
            one = self.take(np.array([i]))
            return one.record(0, one.bands())
        t = self.table
        m = int(self.time["m"][i])
        layout = {k: int(t[k][i]) for k in ("dp", "tp", "pp", "vp", "cp")}
        layout |= {
            "cp_comm": (CP_COMM_NAMES[int(t["cc"][i])].value if t["cp"][i] > 1 else None),
            "cp_a2a": (int(t["cu"][i]) if t["cp"][i] > 1 and t["cc"][i] == _A2A_RING
                       else None),
            "ep": int(t["ep"][i]),
            "etp": int(t["etp"][i]),
            "edp": int(edp(t)[i]),
            "zero": int(t["zero"][i]),
            "recompute": RECOMPUTE_NAMES[int(t["rc"][i])].value,
            "sp": bool(t["sp"][i]),
            "micro_batch": int(t["mb"][i]),
            "grad_accum": m,
            "stage_layers": self.stage_layers(i),
            "split": self.split_kind(i),
            "schedule": SCHEDULE_NAMES[int(t["sch"][i])].value,
            "recompute_layers": (int(t["rn"][i]) if t["rn"][i] >= 0 and t["rc"][i] == 2
                                 else None),
            "recompute_group": (int(-t["rn"][i]) if t["rn"][i] < 0 and t["rc"][i] == 2
                                else None),
            "recompute_modules": ([m.value for m in mask_modules(int(t["rm"][i]))
                                   or [RecomputeModule.CORE_ATTN]] if t["rc"][i] == 1 else None),
            "offload_layers": int(t["ao"][i]),
            "optimizer_offload": float(t["oo"][i]) / 100.0,
        }
        return {
            "model": self.problem.model.name,
            "gpu": self.problem.cluster.gpu.name,
            "n_gpus": self.problem.cluster.n_gpus,
            "slug": self.table.row(i).slug,
            "layout": layout,
            "memory_gib": {k: float(self.memory[k][i] / GiB) for k in MEMORY_KEYS}
            | {"total_high": float(bands.memory_total_high[i] / GiB),
               "by_stage": self.by_stage(i)},
            "fits": bool(self.fits[i]),
            "memory_risk": bool(memory_risk(self.memory, bands.memory_total_high)[i]),
            "time_s": {k: float(self.time[k][i]) for k in TIME_KEYS}
            | {"step_low": float(bands.step_low[i]), "step_high": float(bands.step_high[i])},
            "mfu": float(self.mfu[i]),
            "tokens_per_s_per_gpu": float(self.tokens_per_s_per_gpu[i]),
            "model_flops_per_step": float(self.model_flops_per_step),
            "job": self.problem.job.model_dump(),
            "profile_basis": self.problem.profile_basis,
            "band": bands.basis(i),
            "model_params": self.arch.param_counts(),
            "notes": self._notes(i),
        }

    def _notes(self, i: int) -> list[str]:
        """What the figures of row i leave out that its layout makes matter."""
        notes = []
        ignored = self.problem.ignored_note()  # settings given that change nothing here
        if ignored:
            notes.append(ignored)
        if self.arch.hybrid is not None and int(self.table["pp"][i]) > 2:
            # `cost.layer_types._stage_counts`: the middle stage kind is rank 1's layers
            notes.append("the middle stage is costed as pipeline rank 1; another middle rank "
                         "of this hybrid pattern may hold heavier layers (not checked)")
        if self.arch.hybrid is not None:
            notes.extend(self._scan_notes(i))
        return notes

    def _scan_notes(self, i: int) -> list[str]:
        """One line per recurrent mixer kind: which limit sets its scan's time (`cost.ssm_mixer.
        scan_limits`), per layer and micro-batch, forward + backward."""
        from .cost.ssm_mixer import scan_limits

        names = {"M": "Mamba-2 scan", "G": "gated DeltaNet scan"}
        row = self.table.take(np.array([i]))
        eff = self.problem.profile.scan_efficiency
        out = []
        for letter, mx in self.arch.hybrid.mixers.items():
            compute, memory = (float(x[0]) * 1e3 for x in scan_limits(self.problem, mx, row))
            name = names.get(letter, f"{letter} scan")
            if memory >= compute:
                out.append(f"{name}: memory-bound, {memory:.3g} ms per layer and micro-batch "
                           f"(its kernels' bytes at HBM bandwidth; the scan_efficiency ceiling "
                           f"{eff:g} gives {compute:.3g} ms)")
            else:
                out.append(f"{name}: {compute:.3g} ms per layer and micro-batch at the "
                           f"scan_efficiency ceiling {eff:g} (its kernels' bytes alone: "
                           f"{memory:.3g} ms)")
        return out

    def by_stage(self, i: int) -> list[dict]:
        """Memory of every pipeline stage kind of row i (GiB): `first` (rank 0), `middle` (ranks
        1..pp-2 as rank 1: the most loaded of them for a transformer, whose middle ranks hold the
        same layers and rank 1 the most micro-batches in flight; a hybrid pattern's record says
        in `notes` that another may be heavier), `last` (rank pp-1); `only` when pp = 1. Each
        entry holds the ledger items and the three figures (allocated, reserved, device)."""
        pp = int(self.table["pp"][i])
        if pp == 1:
            kinds = [("only", "first", [0])]
        else:
            kinds = [("first", "first", [0])]
            if pp > 2:
                kinds.append(("middle", "middle", list(range(1, pp - 1))))
            kinds.append(("last", "last", [pp - 1]))
        return [{"stage": label, "pp_ranks": ranks}
                | {k: float(self.memory[f"{key}.{k}"][i] / GiB) for k in STAGE_KEYS}
                for label, key, ranks in kinds]

    def stage_layers(self, i: int) -> list[float]:
        """Transformer layers per pipeline stage of row i, first to last (whole numbers for a
        layout that passes the `layers` rule)."""
        first, mid, last, _ = stage_layer_counts(self.arch.n_layers, self.table.take([i]))
        pp = int(self.table["pp"][i])
        if pp == 1:
            return [_whole(self.arch.n_layers)]
        f, md, la = (_whole(float(np.asarray(x).reshape(-1)[0])) for x in (first, mid, last))
        return [f] + [md] * (pp - 2) + [la]

    def split_kind(self, i: int) -> str:
        """How row i's layers are split over the pipeline stages: `even`, `balanced` (the split
        `plan` takes for its pp x vp, `splits.default_split`) or `custom`."""
        from .splits import split_kind

        t = self.table
        return split_kind(self.arch, self.problem.training.seq_len, int(t["pp"][i]),
                          int(t["vp"][i]), self.stage_layers(i))

    def columns(self) -> dict[str, np.ndarray]:
        """Flat columns: layout, `mem_<item>_gib`, `time_<item>_s`, `fits`, `mfu`, throughput."""
        t = self.table
        cols: dict[str, np.ndarray | list] = {
            k: t[k] for k in ("dp", "tp", "pp", "vp", "cp", "ep", "etp")
        }
        cols["edp"] = edp(t).astype(np.int64)
        cols["zero"] = t["zero"]
        cols["recompute"] = np.array([RECOMPUTE_NAMES[int(c)].value for c in t["rc"]], dtype=object)
        cols["sp"] = t["sp"].astype(bool)
        cols["micro_batch"] = t["mb"]
        cols["grad_accum"] = self.time["m"].astype(np.int64)
        cols["schedule"] = np.array([SCHEDULE_NAMES[int(c)].value for c in t["sch"]], dtype=object)
        cols["cp_comm"], cols["cp_a2a"] = cp_form_columns(t)
        cols["first_stage_layers"] = t["lf"]
        cols["last_stage_layers"] = t["ll"]
        for k in MEMORY_KEYS:
            cols[f"mem_{k}_gib"] = self.memory[k] / GiB
        cols["mem_first_stage_gib"] = self.memory["first.allocated"] / GiB
        cols["mem_last_stage_gib"] = self.memory["last.allocated"] / GiB
        for k in TIME_KEYS:
            cols[f"time_{k}_s"] = self.time[k]
        bands = self.bands()
        cols["mem_total_high_gib"] = bands.memory_total_high / GiB
        cols["time_step_low_s"] = bands.step_low
        cols["time_step_high_s"] = bands.step_high
        cols["fits"] = self.fits
        cols["memory_risk"] = memory_risk(self.memory, bands.memory_total_high)
        cols["mfu"] = self.mfu
        cols["tokens_per_s_per_gpu"] = self.tokens_per_s_per_gpu
        return cols


def memory_risk(memory: dict[str, np.ndarray], total_high: np.ndarray) -> np.ndarray:
    """Per row: the upper end of the memory band (`total_high`, the allocated peak 9 runs in 10
    stay under: `Bands.memory_total_high`) exceeds the usable memory, so the layout may run out
    of memory although its predicted peak fits."""
    return total_high > memory["usable"]


BLOCK_ROWS = 131072
"""Most rows a ledger costs at a time (a ledger costs each row on its own: the blocks' results
are the whole table's). Measured with `WORKERS` = 2 on the 2-core CI machine, `plan` for
DeepSeek-V3 on 16,384 H100 (`benchmarks/search_speed.py`): 1.29 s with blocks of 32,768 rows,
1.22 s with 65,536, 1.17 s with 131,072 (one thread, 32,768: 1.37 s); a block's temporaries cost
about 115 MB more resident memory at 131,072 than at 32,768."""
SPLIT_ROWS = 16384
"""Fewest rows per block when a table is split only to keep every worker busy (a table of
fewer than `WORKERS` x this is one block: a thread's start costs more than it saves)."""
WORKERS = min(2, os.cpu_count() or 1)
"""Threads that cost blocks at once. numpy's array loops release the GIL, so two blocks' ledgers
overlap where their arrays are long; more threads than two gained nothing measurable on the
blocks' Python-level work, which holds the GIL."""


def block_size(n: int) -> int:
    """Rows per block for a table of `n` rows: equal blocks of at most `BLOCK_ROWS`, as many as
    a multiple of `WORKERS` once each can hold `SPLIT_ROWS` (154,224 rows: two blocks of 77,112,
    not 131,072 and 23,152, which would leave one thread idle most of the time; 609,352 rows:
    six of 101,559, not five, of which one thread would cost three and the other two)."""
    blocks = -(-n // BLOCK_ROWS)
    if n >= WORKERS * SPLIT_ROWS:
        blocks = -(-blocks // WORKERS) * WORKERS
    return -(-n // max(blocks, 1))


def _cost_block(ledger, problem: Problem, arch: Arch, table: LayoutTable, start: int, stop: int):
    """One block's ledger, under the error state the ledgers expect (numpy's error state is
    per thread: a worker thread does not inherit the caller's)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return ledger(problem, arch, table.take(slice(start, stop)))


def in_blocks(ledger, problem: Problem, arch: Arch, table: LayoutTable,
              keep: tuple[str, ...] | None = None):
    """`ledger(problem, arch, table)` (`memory_ledger`, `time_ledger`) over blocks of
    `block_size` rows, costed by `WORKERS` threads and joined in row order: a dict of every key,
    or, with `keep`, a `Ledger` that stores those keys for every row and costs the others when
    they are read."""
    n = len(table)
    size = block_size(n)
    if n <= size:
        whole = _cost_block(ledger, problem, arch, table, 0, n)
        if keep is None:
            return whole
        return Ledger(ledger, problem, arch, table, {k: whole[k] for k in keep}, tuple(whole))
    # each block's arrays are copied into the whole table's as soon as it is costed (the
    # blocks' memory is reused, not held until one join at the end)
    joined: dict[str, np.ndarray] = {}
    keys = None
    with ThreadPoolExecutor(WORKERS) as pool:
        parts = pool.map(lambda i: (i, _cost_block(ledger, problem, arch, table, i, i + size)),
                         range(0, n, size))
        for i, part in parts:
            keys = keys or tuple(part)
            for k in (part if keep is None else keep):
                v = part[k]
                whole = joined.get(k)
                if whole is None:
                    whole = joined[k] = np.empty(n, dtype=v.dtype)
                elif whole.dtype != v.dtype:  # as np.concatenate would: the common type
                    whole = joined[k] = whole.astype(np.result_type(whole, v))
                whole[i:i + len(v)] = v
    return joined if keep is None else Ledger(ledger, problem, arch, table, joined, keys)


def rule_flags(problem: Problem, arch: Arch, table: LayoutTable, rules=None) -> np.ndarray:
    """`rules.check_rules` over blocks of rows costed by `WORKERS` threads (each rule reads its
    own row alone, so the flags are the whole table's; tests/test_row_independence.py)."""
    def flags(p, a, t):
        return {"flags": check_rules(p, a, t, rules)}
    return in_blocks(flags, problem, arch, table)["flags"]


RANKED_MEMORY = ("fit_peak", "usable", "total")
"""Memory keys a search reads for every row (fits, ranking, bands); `lazy` keeps only them."""
RANKED_TIME = ("step", "m") + COMM_ITEMS
"""Time keys a search reads for every row (ranking, bands); `lazy` keeps only them."""


def evaluate(problem: Problem, table: LayoutTable, rules=None, arch: Arch | None = None,
             memory: dict[str, np.ndarray] | None = None, lazy: bool = False,
             reject: np.ndarray | None = None) -> Evaluation:
    """Rules, memory and time for every row of `table` (rows that break rules are still costed;
    their `reject` flags say why they cannot run). `memory`: the memory ledger of these rows,
    when the caller has it already (`plan` costs memory before time). `lazy`: keep only the
    keys a ranking reads for every row (`RANKED_MEMORY`, `RANKED_TIME`); the others are costed
    for the rows that read them (`Ledger`). `reject`: the rows' rule flags, when the caller has
    them (`plan`'s rows pass every rule: `enumerate_valid`)."""
    arch = arch or build_arch(problem.model)
    flags = rule_flags(problem, arch, table, rules) if reject is None else reject
    if memory is None:
        memory = in_blocks(memory_ledger, problem, arch, table,
                           keep=RANKED_MEMORY if lazy else None)
    time = in_blocks(time_ledger, problem, arch, table, keep=RANKED_TIME if lazy else None)
    flags = flags | np.where(memory["fit_peak"] > memory["usable"], int(Reject.OOM), 0)
    n = problem.cluster.n_gpus
    flops = float(problem.training.global_batch * arch.model_flops_per_sequence(problem.training.seq_len))
    step = time["step"]
    with np.errstate(divide="ignore", invalid="ignore"):
        mfu = flops / (step * problem.cluster.gpu.bf16_tflops * TFLOPS * n)
        tps = problem.training.tokens_per_step / step / n
    return Evaluation(problem, arch, table, flags, memory, time, mfu, tps, flops)


def estimate(problem: Problem, layout: Layout, rules=None) -> dict:
    """Memory and time of one layout, as the estimate JSON dict. A layout that names no split
    where pp x vp does not divide the layers takes the balanced split `plan` would
    (`splits.with_default_split`), recorded in `layout.stage_layers` / `layout.split` and
    said in `notes`.

    Example:
        >>> from autoparallel import make_problem, Layout, estimate
        >>> p = make_problem("llama3-8b", "h100", 8, seq_len=4096, global_batch=64)
        >>> r = estimate(p, Layout(zero=2, micro_batch=2))
        >>> round(r["memory_gib"]["activations"], 1) > 0
        True

    Raises:
        SpecError: the layout breaks a rule other than memory (degrees do not multiply to the
            GPU count, tp does not divide the heads, ...); not fitting in memory is not an error,
            it is `fits: false`.
    """
    from .splits import with_default_split

    layout, note = with_default_split(problem, layout)
    resolved = layout.resolved(problem.cluster.n_gpus)
    table = LayoutTable.from_layouts([resolved], problem.cluster.n_gpus, problem.model.n_layers)
    ev = evaluate(problem, table, rules)
    broken = int(ev.reject[0]) & ~int(Reject.OOM)
    if broken:
        raise SpecError(_layout_error(problem, resolved, broken))
    rec = ev.record(0)
    if note:
        rec["notes"].append(note)
    return rec


def _whole(x: float):
    """An integral float as int (layer counts), else the float."""
    return int(x) if float(x).is_integer() else float(x)


def _split_broken(problem: Problem, lay: Layout) -> bool:
    """Whether the layout's layer split itself breaks the layers rule (`rules.split_violated`)."""
    one = LayoutTable.from_layouts([lay], problem.cluster.n_gpus, problem.model.n_layers)
    return bool(split_violated(build_arch(problem.model), one)[0])


def _layout_error(problem: Problem, lay: Layout, flags: int) -> str:
    """One readable message per violated rule, with the values involved."""
    m, c, tr = problem.model, problem.cluster, problem.training
    lines = []
    if flags & Reject.WORLD:
        rest = lay.tp * lay.pp * lay.cp
        if c.n_gpus % rest:  # no dp can make up the count: the other degrees must change
            fits = [d for d in (1, 2, 4, 8, 16, 32, 64) if c.n_gpus % d == 0][-3:]
            how = (f"`tp x pp x cp` = {lay.tp} x {lay.pp} x {lay.cp} = {rest} does not divide "
                   f"the {c.n_gpus} GPUs, so no dp makes up the count; choose degrees whose "
                   f"product divides {c.n_gpus} (e.g. {', '.join(map(str, fits))})")
        else:
            how = "leave --dp out to derive it, or change the other degrees"
        lines.append(
            f"`dp x tp x pp x cp` = {lay.dp} x {lay.tp} x {lay.pp} x {lay.cp} = "
            f"{lay.dp * rest} but the cluster has {c.n_gpus} GPUs; {how}"
        )
    if flags & Reject.HEADS:
        lines.append(
            f"`tp` = {lay.tp} must divide `n_heads` ({m.n_heads}) and divide or be a multiple of "
            f"`n_kv_heads` ({m.kv_heads}): each TP rank needs whole heads"
        )
    beyond = [False, False]
    if flags & Reject.LAYERS:  # the part of the rule (`rules._layers`) this layout breaks
        one = LayoutTable.from_layouts([lay], c.n_gpus, m.n_layers)
        beyond = [bool(x[0]) for x in counts_beyond_layers(m.n_layers, one)]
        if beyond[0]:
            lines.append(f"`offload_layers` ({lay.offload_layers}) must be below the model's "
                         f"{m.n_layers} layers (Megatron-Core's cpu_offloading_num_layers is in "
                         f"[0, num_layers)); give at most {m.n_layers - 1}")
        if beyond[1]:
            n = int(chunk_layers(m.n_layers, one)[0])
            lines.append(f"`recompute_layers` ({lay.recompute_layers}) is more than the {n} "
                         f"layers of a model chunk (the block method recomputes the first N of "
                         f"each chunk); give at most {n}, or leave it out for all of them")
        flags = flags & ~Reject.LAYERS if any(beyond) and not _split_broken(problem, lay) \
            else flags
    if flags & Reject.LAYERS and lay.stage_layers:
        lines.append(
            f"`stage_layers` {lay.stage_layers} must sum to `n_layers` ({m.n_layers}) with the "
            f"middle stages divisible by vp ({lay.vp}): each middle model chunk holds a whole "
            "number of layers"
        )
    elif flags & Reject.LAYERS:
        lines.append(
            f"`pp x vp` = {lay.pp * lay.vp} does not divide `n_layers` ({m.n_layers}) and no "
            "uneven split with equal middle stages within a layer of the balanced load exists: "
            "give one (`stage_layers`, e.g. 7,8x14,7) or a pp that divides the layers"
        )
    if flags & Reject.SEQ:  # the part of the rule (`rules._seq`) this layout breaks
        s = tr.seq_len
        if lay.cp > 1 and s % (2 * lay.cp):
            lines.append(f"`seq_len` ({s}) must be divisible by 2 x cp = {2 * lay.cp} (the "
                         "load-balanced ring splits each sequence into 2 x cp chunks); use a cp "
                         f"with 2 x cp dividing {s}, or a sequence length divisible by {2 * lay.cp}")
        if lay.sp and (s // lay.cp) % lay.tp:
            share = "" if lay.cp == 1 else f"'s CP share ({s // lay.cp})"
            lines.append(f"`seq_len` ({s}){share} must be divisible by tp = {lay.tp} with "
                         "sequence parallelism (each TP rank keeps a whole slice of it); use a "
                         "tp that divides it, or turn SP off")
    if flags & Reject.CP_HEADS:
        u = lay.cp if lay.cp_form == CpComm.A2A else (lay.cp_a2a or 1)
        q = m.n_heads // lay.tp
        kv = max(m.kv_heads // min(lay.tp, m.kv_heads), 1)
        extra = " (or a multiple of them: this stack replicates KV heads)" \
            if problem.stack.cp_kv_replicate else ""
        lines.append(
            f"context-parallel form `{lay.cp_form.value}` splits the heads over all-to-all groups "
            f"of {u}: each TP rank's {q} query heads and {kv} KV heads must divide by {u}{extra}; "
            "use ring or allgather, a smaller cp (or cp_a2a), or a smaller tp")
    if flags & Reject.CP_WINDOW:
        lines.append(
            f"context-parallel form `{lay.cp_form.value}` passes K, V around a ring, which "
            f"Transformer Engine does not run with sliding-window attention (window "
            f"{m.sliding_window}); use a2a or allgather")
    if flags & Reject.BATCH:
        lines.append(
            f"`global_batch` ({tr.global_batch}) must be divisible by dp x micro_batch = "
            f"{lay.dp} x {lay.micro_batch} = {lay.dp * lay.micro_batch}"
        )
    if flags & Reject.INTERLEAVE:
        mb = tr.global_batch // max(lay.dp * lay.micro_batch, 1)
        lines.append(
            f"interleaving (`vp` = {lay.vp}) needs pp > 1 and micro-batches per step ({mb}) "
            f"to be a multiple of pp ({lay.pp})"
        )
    if flags & Reject.SCHEDULE:
        mb = tr.global_batch // max(lay.dp * lay.micro_batch, 1)
        lines.append(
            f"schedule `{lay.pipeline_schedule.value}` with pp = {lay.pp}, vp = {lay.vp} and {mb} "
            "micro-batches: 1f1b/zb-h1/dualpipe run vp = 1, interleaved vp > 1, zbv/dualpipev "
            "vp = 2, all but 1f1b need pp > 1; dualpipe needs an even pp and micro-batch count "
            "and dualpipe(v) at "
            "least 2 x pp micro-batches"
        )
    if flags & Reject.LAYER_TYPE:
        from .cost.layer_rules import layer_type_message
        from .presets import list_stacks, load_stack

        hybrid = [n for n in list_stacks() if load_stack(n).hybrid_layers]
        lines.append(layer_type_message(problem, lay, hybrid))
    if flags & Reject.EXPERTS and m.moe is None:
        lines.append(
            f"`ep` = {lay.ep} and `etp` = {lay.expert_tp} (tp = {lay.tp}): a dense model has no "
            "experts to split; leave --ep and --etp out (ep = 1, etp = tp)"
        )
    elif flags & Reject.EXPERTS:  # the parts of the rule (`rules._experts`) this layout breaks
        grid = lay.tp * lay.cp * lay.dp
        n_e, f_e = m.moe.n_experts, m.moe.expert_ffn_hidden_size
        if n_e % lay.ep:
            lines.append(f"`ep` = {lay.ep} must divide the {n_e} experts (each rank holds whole "
                         "experts)")
        if f_e % lay.expert_tp:
            lines.append(f"`etp` = {lay.expert_tp} must divide the expert FFN width ({f_e}): "
                         "each expert-TP rank holds whole columns")
        if grid % (lay.expert_tp * lay.ep):
            lines.append(
                f"etp x ep = {lay.expert_tp} x {lay.ep} = {lay.expert_tp * lay.ep} must divide "
                f"the tp x cp x dp = {lay.tp} x {lay.cp} x {lay.dp} = {grid} ranks of a pipeline "
                "stage (parallel folding: the expert grid etp x ep x edp covers them); use a "
                "smaller ep or etp, or more data-parallel ranks")
    if flags & Reject.TP_NODE:
        lines.append(
            (f"`tp` = {lay.tp}" if lay.expert_tp == lay.tp
             else f"`tp` = {lay.tp} or `etp` = {lay.expert_tp}")
            + f" does not fit inside one NVLink domain of {c.nvlink_domain} GPUs; use "
            + ("a tp that divides" if lay.expert_tp == lay.tp else "a tp and an etp that divide")
            + " the domain, or allow TP across nodes "
            "(--allow-tp-across-nodes prices it on the network)"
        )
    for extra in explain(flags & int(Reject.EP_NODE | Reject.A2A_OVERLAP | Reject.MOE_SP)):
        lines.append(extra)
    return "layout: " + "; ".join(lines)
