"""Capacity planning: how long, on how many GPUs of which kind, at what cost and energy.

For each GPU kind and count, the best layout of the job (`search.plan`, rank 1) gives a step time
with its error band (`autoparallel.bands`); from it:

- tokens/s = tokens per step / step;  compute days = token budget / tokens/s / 86,400;
- goodput: interruptions arrive at rate n_gpus / MTBF_gpu (job MTBF M = MTBF_gpu / n_gpus);
  checkpoints every tau = sqrt(2 C M) (Young 1974, "A first order approximation to the optimum
  checkpoint interval", CACM 17(9); C = checkpoint write time); each interruption loses tau / 2
  of work on average plus the restart time R, so (first-order model, Daly 2006, FGCS 22(3))

      wall = compute x (1 + C / tau) / (1 - (tau / 2 + R) / M),   goodput = compute / wall;

  a job that cannot progress (tau / 2 + R >= M) gets infinite days;
- GPU-hours = wall hours x n_gpus; cost = GPU-hours x price (per GPU-hour, given per kind;
  no built-in prices);
- energy = GPU-hours x TDP x power_fraction x (1 + node_overhead) x PUE.

Every figure comes with its band: `_low` from `step_low`, `_high` from `step_high` (the
pessimistic end), the same goodput model applied to each.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from .errors import SpecError
from .limits import MAX_GPUS
from .values import MAX_TOKENS, parse_count_list, parse_global_batch, parse_tokens  # noqa: F401
from .values import parse_duration as _parse_duration

LLAMA3_INTERRUPTIONS = 419
LLAMA3_DAYS = 54
LLAMA3_GPUS = 16384
MTBF_GPU_HOURS = LLAMA3_DAYS * 24 * LLAMA3_GPUS / LLAMA3_INTERRUPTIONS
"""Default per-GPU mean time between job interruptions, hours (~50,700): Llama 3 report
(Grattafiori et al. 2024, "The Llama 3 Herd of Models", §3.3.4): 419 unexpected interruptions in
a 54-day snapshot of pre-training on 16,384 H100 GPUs, i.e. one every ~3.1 h for the job."""
CKPT_WRITE_S = 60.0
"""Default time a checkpoint stalls training, seconds (assumed; sharded asynchronous checkpointing
can be far less, a synchronous save of a large model to shared storage more)."""
CKPT_RESTORE_S = 600.0
"""Default time from an interruption to training again (detect, reschedule, load the last
checkpoint), seconds (assumed)."""
POWER_FRACTION = 1.0
"""Average GPU power as a share of its TDP. Default 1.0, the convention of the Llama 3 model card
(energy = GPU-hours x TDP, "H100-80GB (TDP of 700W)"): an upper bound."""
NODE_OVERHEAD = (10.2e3 - 8 * 700) / (8 * 700)
"""Host power (CPUs, memory, NICs, switches in the node, fans) per watt of GPU power: DGX H100
datasheet, ~10.2 kW maximum system power with 8 x 700 W GPUs -> 0.82 (a maximum)."""
PUE = 1.10
"""Power usage effectiveness of the data centre: Google's fleet-wide trailing-twelve-month PUE of
1.10 (Google data centres efficiency report, 2023)."""

def parse_counts(text: str) -> list[int]:
    """'512,1024', '16K' or a range 'lo:hi:x2' (multiply) / 'lo:hi:+512' (add) -> GPU counts
    (`values.parse_count_list`)."""
    return parse_count_list(text, "--gpus", ranges=True, high=MAX_GPUS,
                            max_items=MAX_COUNTS, sort=True) or []


MAX_COUNTS = 4096
"""Most GPU counts one `capacity` call plans (each count is a full search)."""


def parse_duration(text: str) -> float:
    """'30d', '720h', '2w' -> days (a unit is required: `values.parse_duration`)."""
    return _parse_duration(text, "--deadline", unit=None, high_s=1e9 * 86400.0) / 86400.0


def parse_prices(text: str | None, gpus: Sequence[str]) -> dict[str, float]:
    """'h100=2.1,b200=3.5' -> {gpu: price per GPU-hour}."""
    if not text:
        return {}
    out = {}
    for part in text.split(","):
        name, _, value = part.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise SpecError(f"`--price` {part!r}: write gpu=price per GPU-hour, e.g. h100=2.1") from None
        if not 0 <= out[name.strip()] < math.inf:
            raise SpecError(f"`--price` {part!r}: a price must be a finite number >= 0")
    unknown = sorted(set(out) - set(gpus))
    if unknown:
        raise SpecError(f"`--price` names {', '.join(unknown)}, not among --gpu ({', '.join(gpus)})")
    return out


@dataclass(frozen=True)
class Assumptions:
    """Goodput and energy assumptions (each overridable; defaults and sources above)."""

    mtbf_gpu_hours: float = MTBF_GPU_HOURS
    ckpt_write_s: float = CKPT_WRITE_S
    ckpt_restore_s: float = CKPT_RESTORE_S
    power_fraction: float = POWER_FRACTION
    node_overhead: float = NODE_OVERHEAD
    pue: float = PUE

    def check(self) -> None:
        # upper bounds are sanity bounds far beyond any real value (a week-long checkpoint,
        # twice the TDP, ten times the host power, a PUE of 10)
        week = 7 * 86400.0
        for name, lo, hi in (("mtbf_gpu_hours", 0.0, 1e12), ("ckpt_write_s", 0.0, week),
                             ("ckpt_restore_s", 0.0, week), ("power_fraction", 0.0, 2.0),
                             ("node_overhead", 0.0, 10.0), ("pue", 1.0, 10.0)):
            v = getattr(self, name)
            said = f"`{name}` ({ASSUMPTION_FLAGS[name]})"  # the field, and the option setting it
            if not (v >= lo) or math.isinf(v) or (name in ("mtbf_gpu_hours",) and v <= 0):
                raise SpecError(f"{said} = {v}: must be {'> 0' if name == 'mtbf_gpu_hours' else f'>= {lo}'}")
            if v > hi:
                raise SpecError(f"{said} = {v:g}: beyond the sanity bound {hi:g}; give a "
                                "realistic value")


ASSUMPTION_FLAGS = {"mtbf_gpu_hours": "--mtbf", "ckpt_write_s": "--ckpt-write",
                    "ckpt_restore_s": "--ckpt-restore", "power_fraction": "--power-fraction",
                    "node_overhead": "--node-overhead", "pue": "--pue"}
"""The `autoparallel capacity` option that sets each assumption (named in its errors)."""


def goodput(n_gpus: int, a: Assumptions) -> tuple[float, float, float]:
    """(wall / compute factor, checkpoint interval s, job MTBF s) for `n_gpus` (module doc)."""
    M = a.mtbf_gpu_hours * 3600.0 / n_gpus
    C, R = a.ckpt_write_s, a.ckpt_restore_s
    tau = math.sqrt(2.0 * C * M)  # Young 1974
    if C == 0:
        return 1.0 / max(1e-300, 1.0 - R / M) if R < M else math.inf, 0.0, M
    denom = 1.0 - (tau / 2.0 + R) / M  # Daly 2006, first order
    return ((1.0 + C / tau) / denom if denom > 0 else math.inf), tau, M


def _row(problem, rec: dict | None, tokens: float, a: Assumptions, price: float | None) -> dict:
    gpu, n = problem.cluster.gpu, problem.cluster.n_gpus
    base = {"gpu": gpu.name, "n_gpus": n}
    if rec is None:
        return base | {"fits": False, "layout": None}
    factor, tau, mtbf = goodput(n, a)
    tps_step = problem.training.tokens_per_step
    ts = rec["time_s"]
    out = base | {"fits": True, "layout": rec["slug"], "step_s": ts["step"],
                  "step_low_s": ts["step_low"], "step_high_s": ts["step_high"], "mfu": rec["mfu"],
                  "goodput": (1.0 / factor) if factor < math.inf else 0.0,
                  "checkpoint_interval_s": tau, "job_mtbf_h": mtbf / 3600.0,
                  "band_level": rec["band"]["step_level"]}
    watts = (gpu.tdp_w or math.nan) * a.power_fraction * (1.0 + a.node_overhead) * a.pue
    for suffix, step in (("", ts["step"]), ("_low", ts["step_low"]), ("_high", ts["step_high"])):
        tps = tps_step / step
        days = tokens / tps / 86400.0 * factor
        gpu_h = days * 24.0 * n
        out[f"tokens_per_s{suffix}"] = tps
        out[f"days{suffix}"] = days
        out[f"gpu_hours{suffix}"] = gpu_h
        out[f"cost{suffix}"] = gpu_h * price if price is not None else None
        out[f"energy_mwh{suffix}"] = gpu_h * watts / 1e6 if gpu.tdp_w else None
    # the pessimistic end of throughput is the slow end of the step band
    out["tokens_per_s_low"], out["tokens_per_s_high"] = out["tokens_per_s_high"], out["tokens_per_s_low"]
    return out


def capacity_rows(model, tokens, seq_len: int, global_batch, gpus: Sequence[str],
                  counts: Sequence[int], *, prices: Mapping[str, float] | None = None,
                  assumptions: Assumptions | None = None, rank_by: str = "time",
                  **problem_options) -> list[dict]:
    """One record per (GPU kind, count): the best layout and its throughput, days, GPU-hours,
    cost and energy, each with `_low` / `_high`. `tokens` accepts '15T'; `global_batch` an int
    (sequences) or a suffixed token count ('16M', binary units)."""
    from .problem import make_problem
    from .search.plan import plan

    a = assumptions or Assumptions()
    a.check()
    total = parse_tokens(tokens)
    seqs = parse_global_batch(global_batch, seq_len)
    prices = dict(prices or {})
    if not gpus or not counts:
        raise SpecError("capacity needs at least one --gpu kind and one --gpus count")
    rows = []
    for g in gpus:
        for n in counts:
            problem = make_problem(model, g, n, seq_len, seqs, **problem_options)
            res = plan(problem, top=1, keep=0, rank_by=rank_by)
            rec = res.records()[0] if len(res.ranked) else None
            rows.append(_row(problem, rec, total, a, prices.get(g)))
    return rows


def smallest_meeting(rows: Sequence[dict], deadline_days: float) -> dict[str, int | None]:
    """Per GPU kind, the smallest count whose pessimistic days (`days_high`) meet the deadline."""
    out: dict[str, int | None] = {}
    for r in rows:
        out.setdefault(r["gpu"], None)
        if r["fits"] and r["days_high"] <= deadline_days:
            cur = out[r["gpu"]]
            out[r["gpu"]] = r["n_gpus"] if cur is None else min(cur, r["n_gpus"])
    return out


def capacity_json(rows: Sequence[dict], *, model: str, tokens: float, seq_len: int,
                  global_batch: int, assumptions: Assumptions, rank_by: str,
                  deadline_days: float | None = None) -> dict:
    """The capacity JSON (`autoparallel schema capacity`)."""
    from .schema import SCHEMA_VERSION

    out = {"schema_version": SCHEMA_VERSION,
           "job": {"model": model, "tokens": tokens, "seq_len": seq_len,
                   "global_batch": global_batch, "global_batch_tokens": global_batch * seq_len,
                   "rank_by": rank_by},
           "assumptions": asdict(assumptions), "rows": list(rows), "deadline": None}
    if deadline_days is not None:
        out["deadline"] = {"days": deadline_days,
                           "smallest_n_gpus": smallest_meeting(rows, deadline_days)}
    return out


def plot_capacity(rows: Sequence[dict], path: str, title: str = "") -> None:
    """Days to train (with the band) against GPU count, one line per GPU kind (log-log)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 5.0))
    for g in dict.fromkeys(r["gpu"] for r in rows):
        pts = [r for r in rows if r["gpu"] == g and r["fits"] and math.isfinite(r["days_high"])]
        if not pts:
            continue
        n = [r["n_gpus"] for r in pts]
        line, = ax.plot(n, [r["days"] for r in pts], "o-", label=g)
        ax.fill_between(n, [r["days_low"] for r in pts], [r["days_high"] for r in pts],
                        color=line.get_color(), alpha=0.2)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("days to train (band: p10-p90 of step time)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    from .output.files import save_figure

    try:
        save_figure(fig, "--plot", path, dpi=120)
    finally:
        plt.close(fig)


__all__ = ["Assumptions", "capacity_json", "capacity_rows", "goodput", "parse_counts",
           "parse_duration", "parse_global_batch", "parse_prices", "parse_tokens",
           "plot_capacity", "smallest_meeting"]
