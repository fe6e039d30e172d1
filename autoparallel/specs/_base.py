"""Base class of every user-facing specification."""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from ..limits import MAX_SPEC_FLOAT, MAX_SPEC_INT, MIN_SPEC_FLOAT
from .docstrings import DocstringFields


def _too_big(value: Any) -> bool:
    """True when an integer (or one inside a list) exceeds `MAX_SPEC_INT` in magnitude."""
    if isinstance(value, (list, tuple)):
        return any(_too_big(v) for v in value)
    return isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SPEC_INT


def _float_out_of_range(value: Any) -> bool:
    """True for a float outside [`MIN_SPEC_FLOAT`, `MAX_SPEC_FLOAT`] in magnitude (0 is fine):
    a bandwidth of 1e-313 GB/s or a peak of 1e300 TFLOP/s overflows the time model."""
    if isinstance(value, (list, tuple)):
        return any(_float_out_of_range(v) for v in value)
    return isinstance(value, float) and value != 0 and not MIN_SPEC_FLOAT <= abs(value) <= MAX_SPEC_FLOAT


class Spec(DocstringFields, BaseModel):
    """Frozen pydantic model that rejects unknown keys; attribute docstrings become schema text
    (`specs.docstrings`: read once per module; the class is built on first use).

    Numbers are checked at the edge: floats must be finite (no inf or nan) and, unless 0,
    between `limits.MIN_SPEC_FLOAT` and `limits.MAX_SPEC_FLOAT` in magnitude; no integer may
    exceed `limits.MAX_SPEC_INT` (2^31 - 1), so the cost model's arithmetic cannot overflow. Specs read from files are validated strictly (`validate_strict`)."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True,
                              allow_inf_nan=False)

    @field_validator("*", mode="after")
    @classmethod
    def _bounded_ints(cls, value, info):
        if _too_big(value):
            raise ValueError(f"larger than {MAX_SPEC_INT:,} (2^31 - 1), the bound on every "
                             "count and width; give a realistic value")
        if _float_out_of_range(value):
            raise ValueError(f"outside {MIN_SPEC_FLOAT:g} to {MAX_SPEC_FLOAT:g} in magnitude, the "
                             "bounds on every number in a spec; give a realistic value")
        return value

    @classmethod
    def validate_strict(cls, data: dict):
        """Validate data read from a TOML/JSON file strictly, as JSON: no booleans or strings
        where numbers belong (`n_layers = true` or `"32"` is an error, not 1 or 32), no
        fractions where whole numbers belong. Integers are accepted for floats; strings for
        choices (enums), lists for tuples. Raises pydantic's ValidationError."""
        text = json.dumps(data, default=str, allow_nan=True)
        return cls.model_validate_json(text, strict=True)
