"""Sane bounds on the numbers a user can give, checked at the edge before any array is built.

Counts beyond these are almost surely typos (or attempts to exhaust memory); each bound is far
above any published training run, so a real problem never meets it. Every check gives one line
naming the field, the value, why it is refused and what would work.

- GPUs per job: 2^20 = 1,048,576 (the largest published runs use ~10^5 GPUs).
- Sequence length: 2^24 = 16,777,216 tokens; global batch: 2^24 sequences.
- Any other count or width in a spec (layers, hidden size, heads, experts, axis degrees):
  at most 2^31 - 1, so every product the cost model forms stays exact in int64 and float64.
- Any non-zero float in a spec (bandwidths, peaks, capacities, knobs, `n_params`): between
  1e-30 and 1e15 in magnitude, so that no ratio the time model forms overflows.
- plan `--top`: at most `MAX_TOP_TABLE` rows in a table (rendering is the slow part), more
  with `--format csv|json`.
- Enumerated layouts: `MAX_LAYOUTS` rows built at any step of the enumeration (rows that
  break a rule before the ZeRO and recompute crosses are counted, not built). Costing a layout
  takes on the order of a kilobyte of arrays, so the limit keeps a plan within a few GiB and
  tens of seconds (Llama-3 405B on 16,384 GPUs enumerates 223,164); beyond it, narrow the
  axes or use the sampler (`autoparallel.search.sampler.sample_search`).
- tune: at most `MAX_WORKERS` worker threads and `MAX_TRIALS` trials; plan/sweep `--top` and
  `--keep` at most `MAX_TOP` / `MAX_KEEP`.
"""

from __future__ import annotations

import math

from .errors import SpecError

MAX_GPUS = 2**20
MAX_SEQ_LEN = 2**24
MAX_GLOBAL_BATCH = 2**24
MAX_SPEC_INT = 2**31 - 1
MIN_SPEC_FLOAT = 1e-30
MAX_SPEC_FLOAT = 1e15
MAX_LAYOUTS = 4_000_000
MAX_WORKERS = 256
MAX_TRIALS = 1_000_000
MAX_TOP = 1_000_000
MAX_TOP_TABLE = 1_000
MAX_KEEP = 1_000_000


def check_int(field: str, value, *, low: int = 1, high: int = MAX_SPEC_INT, why: str = "") -> int:
    """`value` as an int within [low, high], else a SpecError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise SpecError(f"`{field}` = {value!r}: must be a whole number between {low:,} and {high:,}")
    if value < low:
        raise SpecError(f"`{field}` = {value:,}: must be at least {low:,}")
    if value > high:
        reason = f" ({why})" if why else ""
        raise SpecError(f"`{field}` = {value:,}: larger than the limit {high:,}{reason}; "
                        f"give at most {high:,}")
    return value


def check_float(field: str, value, *, low: float = 0.0, low_open: bool = True,
                high: float = math.inf) -> float:
    """`value` as a finite float within (low, high], else a SpecError naming `field`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"`{field}` = {value!r}: must be a number")
    if not math.isfinite(value):
        raise SpecError(f"`{field}` = {value}: must be a finite number")
    if value < low or (low_open and value == low):
        bound = "positive" if low == 0 and low_open else f"{'>' if low_open else '>='} {low:g}"
        raise SpecError(f"`{field}` = {value}: must be {bound}")
    if value > high:
        raise SpecError(f"`{field}` = {value}: must be at most {high:g}")
    return float(value)
