"""Base class of every user-facing specification."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Frozen pydantic model that rejects unknown keys; attribute docstrings become schema text."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
