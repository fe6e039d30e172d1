"""One parser per kind of value a user types: counts (`16K` GPUs, `8K` tokens per sequence),
token budgets (`15T`), global batches (`2048` sequences or `16M` tokens) and durations (`30d`,
`15m`). Every command, the Python API and the spec files' CLI twins use these, so `16K` means the
same everywhere, and a bad value gets one `SpecError` naming the flag, the value and what works.

Suffixes:
- counts and batch tokens are binary (K = 2^10, M = 2^20, G = 2^30), as GPU counts, sequence
  lengths and batch sizes are quoted: "16K H100" = 16,384 (Llama 3), "8K context" = 8,192,
  "16M tokens" = 2048 x 8192 = 2^24;
- token budgets are decimal (K = 10^3, M = 10^6, B = G = 10^9, T = 10^12): "15T tokens" =
  1.5 x 10^13 (Llama 3).
"""

from __future__ import annotations

import math
import re

from .errors import SpecError

BINARY = {"": 1, "K": 2 ** 10, "M": 2 ** 20, "G": 2 ** 30}
"""Multipliers of a count's suffix."""
DECIMAL = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
"""Multipliers of a token budget's suffix."""
SECONDS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
"""Seconds per duration unit."""
MAX_TOKENS = 1e18
"""Sanity bound on a token budget (five orders above the largest published run's 1.5e13)."""

_NUMBER = r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
_COUNT = re.compile(rf"\s*{_NUMBER}\s*([KMG]?)\s*", re.I)


def parse_count(text: str | int, name: str, *, low: int = 1, high: int | None = None,
                why: str = "") -> int:
    """A whole count: `8192`, `8K` (= 8,192), `1.5K` (= 1,536), `16M`; between `low` and
    `high` (`why` says what the upper bound protects)."""
    if isinstance(text, bool):
        raise SpecError(f"`{name}` = {text!r}: give a whole number, e.g. 8, 4096 or 16K")
    if isinstance(text, int):
        value = text
    else:
        m = _COUNT.fullmatch(str(text))
        if not m and _COUNT.fullmatch(str(text).strip().removeprefix("-")):
            raise SpecError(f"`{name}` = {text!r}: must be at least {low}")  # a negative count
        if not m:
            raise SpecError(f"`{name}` = {text!r}: give a whole number, optionally with a binary "
                            "suffix K, M or G (8K = 8,192), e.g. 8, 4096 or 16K")
        exact = float(m.group(1)) * BINARY[m.group(2).upper()]
        if not exact.is_integer():
            raise SpecError(f"`{name}` = {text!r}: {exact:g} is not a whole number")
        value = int(exact)
    if value < low:
        raise SpecError(f"`{name}` = {text!r}: must be at least {low}")
    if high is not None and value > high:
        raise SpecError(f"`{name}` = {text!r}: more than {high:,}"
                        + (f" ({why})" if why else "") + f"; give at most {high:,}")
    return value


def parse_count_list(text: str | None, name: str, *, low: int = 1, high: int | None = None,
                     ranges: bool = False, max_items: int | None = None,
                     sort: bool = False) -> list[int] | None:
    """`8,64,512` (each a `parse_count`, `16K` included) and, with `ranges`, `lo:hi:x2`
    (multiply) or `lo:hi:+512` (add); None stays None. In the given order, or sorted and
    de-duplicated with `sort`."""
    if text is None:
        return None
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    if not parts:
        raise SpecError(f"`{name}` is empty: give at least one value")
    out: list[int] = []
    for part in parts:
        m = re.fullmatch(r"([^:]+):([^:]+):([x+])\s*([0-9]+)", part) if ranges else None
        if m:
            lo = parse_count(m.group(1), name, low=low, high=high)
            hi = parse_count(m.group(2), name, low=low, high=high)
            op, k = m.group(3), int(m.group(4))
            if hi < lo or (op == "x" and k < 2) or (op == "+" and k < 1):
                raise SpecError(f"`{name}` range {part!r}: need lo <= hi and a step x2 or more, "
                                "or +1 or more")
            n = lo
            while n <= hi:
                out.append(n)
                if max_items is not None and len(out) > max_items:
                    raise SpecError(f"`{name}` range {part!r}: more than {max_items:,} values "
                                    "(each is a plan); use a larger step")
                n = n * k if op == "x" else n + k
        elif ":" in part and ranges:
            raise SpecError(f"`{name}` = {text!r}: a range is lo:hi:x2 or lo:hi:+512")
        elif not _COUNT.fullmatch(part):
            raise SpecError(f"`{name}` = {text!r}: expected comma-separated integers, e.g. "
                            "1,2,4 (a K, M or G suffix multiplies by 1,024, 1,024^2, 1,024^3)")
        else:
            out.append(parse_count(part, name, low=low, high=high))
        if max_items is not None and len(out) > max_items:
            raise SpecError(f"`{name}` = {text!r}: more than {max_items:,} values")
    return sorted(set(out)) if sort else out


def parse_tokens(text: str | int | float, name: str = "--tokens") -> float:
    """A token budget: `15T` = 1.5e13 (decimal suffixes K, M, B/G, T), or a plain number."""
    m = re.fullmatch(rf"\s*{_NUMBER}(?:e([0-9]+))?\s*([KMBGT]?)\s*", str(text), re.I)
    if not m:
        raise SpecError(f"`{name}` = {text!r}: give a positive number with an optional suffix "
                        "K, M, B or T (e.g. 15T = 15 x 10^12 tokens)")
    tokens = float(m.group(1)) * 10.0 ** int(m.group(2) or 0) * DECIMAL[m.group(3).upper()]
    if not tokens > 0:
        raise SpecError(f"`{name}` = {text!r}: must be more than 0 tokens")
    if not tokens <= MAX_TOKENS:
        raise SpecError(f"`{name}` = {text!r}: more than {MAX_TOKENS:.0e} tokens, the sanity bound "
                        "(Llama 3 trained on 15T = 1.5e13); give a realistic budget")
    return tokens


def parse_global_batch(text: str | int, seq_len: int | None, name: str = "--global-batch",
                       high: int | None = None) -> int:
    """Sequences per optimizer step: a plain whole number is sequences (`2048`); a number with
    a suffix K, M or G is tokens in binary units, as batch sizes are quoted (Llama 3's "16M
    tokens" = 2^24 = 2048 x 8192), and must be a whole number of `seq_len`-token sequences."""
    s = str(text).strip()
    m = _COUNT.fullmatch(s)
    if isinstance(text, int) or (m and not m.group(2)):
        return parse_count(text, name, high=high)
    if not m:
        raise SpecError(f"`{name}` = {text!r}: give sequences (2048) or tokens with a suffix K, "
                        "M or G in binary units (16M = 2^24 tokens)")
    if seq_len is None:
        raise SpecError(f"`{name}` = {text!r} is in tokens: give --seq-len too, or sequences")
    tokens = float(m.group(1)) * BINARY[m.group(2).upper()]
    seqs = tokens / seq_len
    if abs(seqs - round(seqs)) > 1e-9 or round(seqs) < 1:
        near = max(1, round(seqs))
        raise SpecError(f"`{name}` = {text!r}: {tokens:,.0f} tokens is not a whole number of "
                        f"{seq_len}-token sequences ({seqs:,.2f}); give sequences, e.g. {near}")
    return parse_count(int(round(seqs)), name, high=high)


def parse_duration(text: str | int | float, name: str, *, unit: str | None = "s",
                   high_s: float | None = None) -> float:
    """A duration in seconds: `90`, `90s`, `15m`, `2h`, `30d`, `4w`; a bare number is in
    `unit` (None: a unit must be given). Must be more than 0 (and at most `high_s` seconds)."""
    m = re.fullmatch(rf"\s*{_NUMBER}\s*(s|min|m|h|d|w)?\s*", str(text), re.I)
    if not m or (unit is None and not m.group(2)):
        bare = (f" (a bare number is in {_UNIT_NAMES[unit]})" if unit else
                " with its unit")
        raise SpecError(f"`{name}` = {text!r}: give a duration such as 90s, 15m, 2h, 30d or 4w"
                        + bare)
    seconds = float(m.group(1)) * SECONDS[(m.group(2) or unit).lower()]
    if not 0 < seconds < math.inf:
        raise SpecError(f"`{name}` = {text!r}: must be positive (a duration longer than 0)")
    if high_s is not None and seconds > high_s:
        raise SpecError(f"`{name}` = {text!r}: longer than {format_duration(high_s)}, the "
                        "sanity bound; give a realistic duration")
    return seconds


_UNIT_NAMES = {"s": "seconds", "m": "minutes", "min": "minutes", "h": "hours", "d": "days",
               "w": "weeks"}


def format_duration(seconds: float) -> str:
    """`90 s`, `15 min`, `2 h`, `30 days`: the largest unit that keeps the figure >= 1."""
    for unit, label in (("d", "days"), ("h", "h"), ("m", "min")):
        if seconds >= SECONDS[unit]:
            return f"{seconds / SECONDS[unit]:.3g} {label}"
    return f"{seconds:.3g} s"
