"""One parallel layout (`Layout`) and its slug form `dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1`."""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Literal

from pydantic import PositiveInt, model_validator

from ._base import Spec


class Recompute(StrEnum):
    """Activation recomputation: the strings are Megatron's `--recompute-granularity` values."""

    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


RECOMPUTE_CODES = {Recompute.NONE: 0, Recompute.SELECTIVE: 1, Recompute.FULL: 2}
"""Integer codes used in the vectorised layout table."""
RECOMPUTE_NAMES = {v: k for k, v in RECOMPUTE_CODES.items()}


class Layout(Spec):
    """Degrees of each parallel axis plus memory-saving choices. Degree 1 means the axis is off.

    `dp` may be left out: it is derived from the GPU count (`n_gpus / (tp*pp*cp)`).
    EP is carved out of DP x CP (Megatron's convention) and does not enter that product.
    """

    dp: PositiveInt | None = None
    """Data-parallel degree (derived when omitted)."""
    tp: PositiveInt = 1
    """Tensor-parallel degree."""
    pp: PositiveInt = 1
    """Pipeline-parallel degree."""
    vp: PositiveInt = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; >1 means interleaved 1F1B."""
    cp: PositiveInt = 1
    """Context-parallel degree (sequence split, ring attention)."""
    ep: PositiveInt = 1
    """Expert-parallel degree (MoE only), a divisor of dp x cp."""
    zero: Literal[0, 1, 2, 3] = 1
    """ZeRO stage over the data-parallel group: 1 = distributed optimizer, 3 = FSDP full shard."""
    recompute: Recompute = Recompute.NONE
    """Activation recomputation."""
    sp: bool | None = None
    """Sequence parallelism with TP; defaults to on when tp > 1 (off, and meaningless, at tp = 1)."""
    micro_batch: PositiveInt = 1
    """Sequences per micro-batch."""

    @model_validator(mode="after")
    def _check(self) -> Layout:
        if self.vp > 1 and self.pp == 1:
            raise ValueError(
                f"`vp` ({self.vp}) > 1 needs pipeline parallelism: interleaving splits each "
                "pipeline rank's layers into chunks; set pp > 1 or vp = 1"
            )
        return self

    def resolved(self, n_gpus: int) -> Layout:
        """The same layout with `dp` derived from the GPU count and `sp` made explicit."""
        dp = self.dp
        if dp is None:
            dp = max(1, n_gpus // (self.tp * self.pp * self.cp))
        sp = bool(self.sp if self.sp is not None else self.tp > 1) and self.tp > 1
        return self.model_copy(update={"dp": dp, "sp": sp})

    @property
    def n_gpus(self) -> int:
        """GPUs this layout occupies (dp must be set)."""
        return int(self.dp or 0) * self.tp * self.pp * self.cp

    @property
    def slug(self) -> str:
        """Compact form, parseable by `Layout.from_slug`."""
        sp = "-sp" if self.sp else ""
        return (
            f"dp{self.dp}-tp{self.tp}-pp{self.pp}-vp{self.vp}-cp{self.cp}-ep{self.ep}"
            f"-z{self.zero}-r{self.recompute.value}{sp}-mb{self.micro_batch}"
        )

    @classmethod
    def from_slug(cls, slug: str) -> Layout:
        """Parse `dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1`; omitted axes take defaults."""
        fields: dict = {"sp": False}
        for part in slug.strip().split("-"):
            m = re.fullmatch(r"(dp|tp|pp|vp|cp|ep|z|mb)(\d+)", part)
            if m:
                key = {"z": "zero", "mb": "micro_batch"}.get(m[1], m[1])
                fields[key] = int(m[2])
            elif part == "sp":
                fields["sp"] = True
            elif part.startswith("r") and part[1:] in {r.value for r in Recompute}:
                fields["recompute"] = part[1:]
            else:
                raise ValueError(
                    f"layout slug part {part!r} not understood; expected e.g. "
                    "'dp8-tp4-pp2-vp1-cp1-ep1-z1-rnone-sp-mb1'"
                )
        return cls(**fields)
