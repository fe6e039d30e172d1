"""`SearchSpace`: which values each layout axis may take (omitted axis = every sensible value).

A space is given by flags or by a TOML file (keys at the top level or under `[space]`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, PositiveInt, PrivateAttr, ValidationError, field_validator

from ..errors import SpecError, format_validation_error
from ..specs._base import Spec
from ..specs.layout import CpComm, Recompute, RecomputeModule, Schedule

AXES = ("tp", "pp", "vp", "cp", "ep", "etp", "zero", "recompute", "sp", "micro_batch", "schedule",
        "recompute_modules", "recompute_group", "recompute_layers", "offload_layers",
        "optimizer_offload", "cp_comm", "cp_a2a")


class SearchSpace(Spec):
    """Allowed values per axis; `None` means automatic (all divisors / all choices)."""

    tp: list[PositiveInt] | None = None
    """Tensor-parallel degrees (auto: divisors of the GPU count)."""
    pp: list[PositiveInt] | None = None
    """Pipeline degrees (auto: divisors of the GPU count)."""
    vp: list[PositiveInt] | None = None
    """Virtual stages per pipeline rank (auto: every v with layers divisible by pp x v)."""
    cp: list[PositiveInt] | None = None
    """Context-parallel degrees (auto: divisors of the GPU count)."""
    cp_comm: list[CpComm] | None = None
    """Context-parallel forms to try with cp > 1 (auto: the ones the job's stack implements,
    `StackSpec.cp_comm`)."""
    cp_a2a: list[PositiveInt] | None = None
    """All-to-all group sizes of the hierarchical form a2a+ring (auto: every divisor u of cp
    with 1 < u < cp)."""
    ep: list[PositiveInt] | None = None
    """Expert-parallel degrees (auto: divisors of the experts with etp x ep dividing tp x cp x dp,
    parallel folding)."""
    etp: list[PositiveInt] | None = None
    """Expert tensor-parallel degrees (auto: 1 and the row's tp, Megatron's default and the MoE
    guide's advice; given values: any that divides the expert FFN width inside one NVLink
    domain; tp alone for dense models)."""
    zero: list[int] | None = None
    """ZeRO stages (auto: 0-3)."""
    recompute: list[Recompute] | None = None
    """Recompute choices (auto: none, selective, full)."""
    sp: list[bool] | None = None
    """Sequence parallelism (auto: on and off when tp > 1)."""
    micro_batch: list[PositiveInt] | None = None
    """Micro-batch sizes (auto: divisors of the per-replica batch up to `max_micro_batch`)."""
    schedule: list[Schedule] | None = None
    """Pipeline schedules (auto: 1f1b, interleaved, zb-h1, zbv, dualpipe, dualpipev, each where
    its chunk count and pp allow)."""
    stage_layers: list[PositiveInt] | None = None
    """Pin the layers per pipeline stage, first to last (implies pp = its length)."""
    first_stage_layers: PositiveInt | None = None
    """Pin the first pipeline stage's layers (the other stages share the rest evenly unless
    `last_stage_layers` is pinned too)."""
    last_stage_layers: PositiveInt | None = None
    """Pin the last pipeline stage's layers."""
    recompute_modules: list[RecomputeModule] | None = None
    """Modules selective recompute re-runs (Megatron `--recompute-modules`); None = its default,
    core_attn."""
    recompute_group: list[PositiveInt] | None = None
    """Uniform checkpoint groups to try with full recompute (Megatron `--recompute-method
    uniform --recompute-num-layers`); None = one layer per group only."""
    recompute_layers: list[int] | None = None
    """Block recompute to try besides full recompute of every layer: only the first N layers of
    each model chunk (Megatron `--recompute-method block --recompute-num-layers N`). A row keeps
    the N with 0 < N < its largest chunk (N = 0 is no recompute, N >= the chunk is every layer,
    both searched anyway); None = every layer only."""
    recompute_layers_auto: bool = False
    """With `recompute_layers` None: try N = a quarter, a half and three quarters of each row's
    largest model chunk (`--recompute-num-layers auto`)."""
    offload_layers: list[int] | None = None
    """Layers per stage whose activations are offloaded to the host (Megatron-Core
    `--cpu-offloading-num-layers`; tried where pp = 1 without recompute, as Megatron-Core
    requires); None = off."""
    optimizer_offload: list[float] | None = None
    """Shares of the optimizer state offloaded to the host (Megatron
    `--optimizer-offload-fraction`, ZeRO-Offload); None = off."""
    offload_auto: bool = False
    """With `offload_layers` None: try activation offload of a quarter, half, three quarters and
    all but one of the model's layers (`--offload`)."""
    uneven: bool = True
    """Propose balanced uneven pipeline splits besides the even one."""
    max_micro_batch: PositiveInt = 16
    """Largest micro-batch tried automatically."""
    max_vp: PositiveInt = Field(16, description="Largest virtual-stage count tried automatically.")
    """Largest virtual-stage count tried automatically."""

    @field_validator("stage_layers")
    @classmethod
    def _split_shape(cls, v):
        if v is not None and len(set(v[1:-1])) > 1:
            raise ValueError(f"stage layers {v}: the middle stages must hold equal layer counts "
                             "(only the first and last may differ)")
        return v

    @field_validator(*AXES)
    @classmethod
    def _not_empty(cls, v, info):
        if v is not None and len(v) == 0:
            raise ValueError(f"axis `{info.field_name}` is empty: give at least one value or leave it out")
        if v is not None and info.field_name == "zero" and any(z not in (0, 1, 2, 3) for z in v):
            raise ValueError(f"ZeRO stages must be 0-3, got {v}")
        if v is not None and info.field_name == "offload_layers" and any(x < 0 for x in v):
            raise ValueError(f"offload layers must be >= 0, got {v}")
        if v is not None and info.field_name == "recompute_layers" and any(x < 0 for x in v):
            raise ValueError(f"recompute layers per chunk must be >= 0, got {v}")
        if v is not None and info.field_name == "optimizer_offload" and any(
                not 0 <= x <= 1 or round(x * 100) != round(x * 100, 6) for x in v):
            raise ValueError(f"optimizer offload shares must lie in [0, 1] in steps of 0.01, got {v}")
        return sorted(set(v), key=lambda x: (str(type(x)), x)) if v is not None else v

    _file: str | None = PrivateAttr(default=None)
    """The file the space was read from (`load_space`), for messages."""
    _file_axes: frozenset[str] = PrivateAttr(default=frozenset())
    """The axes that file gave and no flag replaced (`narrowed`)."""

    def narrowed(self, **axes) -> SearchSpace:
        """A copy with the given axes replaced (None values are ignored)."""
        update = {k: v for k, v in axes.items() if v is not None}
        try:
            out = SearchSpace.model_validate({**self.model_dump(), **update})
        except ValidationError as exc:
            raise SpecError(format_validation_error(exc, "search space")) from None
        out._file, out._file_axes = self._file, self._file_axes - set(update)
        return out

    def given(self, axis: str) -> str:
        """How the values of `axis` were given, for a message: `--tp 3` (a flag or the API),
        or "`tp` = [3] in the search space FILE" when a file gave them."""
        value = getattr(self, axis)
        listed = isinstance(value, (list, tuple))
        items = value if listed else ([] if value is None else [value])
        values = ",".join(str(getattr(v, "value", v)) for v in items)
        if axis in self._file_axes:
            shown = f"[{values}]" if listed else values
            return f"`{axis}` = {shown} in the search space {self._file}"
        return f"--{axis.replace('_', '-')} {values}".rstrip()


def load_space(path: str | Path) -> SearchSpace:
    """Read a search space from a TOML/JSON file (`[space]` table or top-level keys)."""
    from ..presets import read_table

    data = read_table(Path(path))
    if "sweep" in data and "space" not in data:
        raise SpecError(f"search space ({path}): a sweep file (its [sweep] table) without a "
                        f"[space] table; run it with `autoparallel sweep {path}`, or give a file "
                        "of axes (tp = [2, 4], ...)")
    table = data.get("space", data)
    try:
        if not isinstance(table, dict):
            raise SpecError(f"search space ({path}): `space` must be a table of axes")
        space = SearchSpace.validate_strict(table)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"search space ({path})")) from None
    space._file = str(path)
    space._file_axes = frozenset(k for k, v in table.items() if v is not None)
    return space


def parse_int_list(text: str | None, flag: str) -> list[int] | None:
    """'1,2,4' -> [1, 2, 4]; None stays None; readable error otherwise."""
    if text is None:
        return None
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise SpecError(f"`{flag}` = {text!r}: expected comma-separated integers, e.g. 1,2,4") from None
    if not values:
        raise SpecError(f"`{flag}` is empty: give at least one value")
    return values
