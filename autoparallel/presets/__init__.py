"""Packaged presets (models, GPUs) and loaders that accept a preset name or a file path.

A model may be a preset name, a TOML/JSON file with `ModelSpec` keys, or a Hugging Face
`config.json` (recognised by `num_hidden_layers`). A GPU may be a preset name or a TOML/JSON file.
"""

from __future__ import annotations

import copy
import difflib
import functools
import json
import tomllib
from importlib import resources
from pathlib import Path

from pydantic import ValidationError

from ..errors import InputWarning, SpecError, format_validation_error
from ..specs.hardware import GPUSpec, Profile
from ..specs.model import ModelSpec
from ..specs.network import NetworkSpec
from ..specs.stack import StackSpec
from .hf import hf_config_to_model_dict, is_hf_config, size_name, text_model_config

__all__ = ["list_models", "list_gpus", "list_stacks", "list_networks", "load_model", "load_gpu",
           "load_stack", "load_network", "load_profile", "read_table"]


def _names(kind: str) -> list[str]:
    return list(_preset_names(kind))


@functools.cache
def _preset_names(kind: str) -> tuple[str, ...]:
    """Names of the packaged presets of one kind (the folder is listed once per process)."""
    folder = resources.files(__package__) / kind
    return tuple(sorted(p.name[: -len(".toml")] for p in folder.iterdir()
                        if p.name.endswith(".toml")))


@functools.cache
def _preset_table(folder: str, name: str) -> dict:
    """A packaged preset's TOML, parsed once per process (callers get a copy)."""
    return tomllib.loads((resources.files(__package__) / folder / f"{name}.toml")
                         .read_text(encoding="utf-8"))


def list_models() -> list[str]:
    """Names of the packaged model presets."""
    return _names("models")


def list_gpus() -> list[str]:
    """Names of the packaged GPU presets."""
    return _names("gpus")


def list_stacks() -> list[str]:
    """Names of the packaged software-stack presets."""
    return _names("stacks")


def list_networks() -> list[str]:
    """Names of the packaged network presets."""
    return _names("networks")


MAX_NESTING = 32
"""Deepest nesting of brackets/braces a spec file may have (specs are a few tables deep)."""


def _depth(text: str) -> int:
    """Deepest nesting of [ and { in `text`, counted without parsing (strings included, which
    only overestimates), so that a hostile file cannot exhaust the parser's recursion."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return deepest


def read_table(path: Path) -> dict:
    """Read a TOML or JSON file into a dict, with readable errors."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"{path}: file not found") from None
    except UnicodeDecodeError:
        raise SpecError(f"{path}: not a text file (expected TOML or JSON)") from None
    except OSError as exc:
        raise SpecError(f"cannot read {path}: {exc.strerror or exc}") from None
    if _depth(text) > MAX_NESTING:
        raise SpecError(f"{path}: nested more than {MAX_NESTING} levels deep; a spec file is a "
                        "few tables deep")
    kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
    try:
        data = json.loads(text) if kind == "JSON" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        how = ("" if path.suffix.lower() in (".json", ".toml") else
               f" (read as TOML: {path.suffix or 'no suffix'!r} is neither .toml nor .json)")
        raise SpecError(f"{path}: not valid {kind}{how}: {exc}; give a .toml or .json spec "
                        "file") from None
    except RecursionError:
        raise SpecError(f"{path}: nested too deeply to read (a spec file is a few tables deep)") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a table of keys at the top level, got {type(data).__name__}")
    return data


def _unknown(kind: str, ref: str, names: list[str]) -> SpecError:
    close = difflib.get_close_matches(ref.lower(), names, n=3, cutoff=0.5)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return SpecError(
        f"`{kind}` = {ref!r}: no such preset and no such file.{hint} "
        f"Presets: {', '.join(names)}; or give a path to a .toml/.json file."
    )


def _resolve(kind: str, ref: str, names: list[str]) -> tuple[dict, str]:
    """Return (raw dict, source label) for a preset name or a file path (for a model, also a
    folder holding a Hugging Face `config.json`, as a downloaded snapshot does)."""
    if not ref.strip():
        raise SpecError(f"`{kind}` is empty: give a preset name ({', '.join(names[:4])}, ...) or "
                        "a .toml/.json file")
    if ref not in names and ref.lower() in names and not Path(ref).exists():
        ref = ref.lower()  # presets are lower case: Llama3-8B is llama3-8b
    if ref in names:
        folder = {"model": "models", "gpu": "gpus", "stack": "stacks", "network": "networks"}[kind]
        return copy.deepcopy(_preset_table(folder, ref)), f"preset {ref}"
    path = Path(ref)
    if path.is_dir():
        if kind == "model" and (path / "config.json").is_file():
            return read_table(path / "config.json"), str(path / "config.json")
        raise SpecError(f"`{kind}` = {ref!r} is a folder; give a .toml/.json file"
                        + (" (a folder is read when it holds a Hugging Face config.json)"
                           if kind == "model" else ""))
    if path.suffix.lower() in {".toml", ".json"} or path.exists():
        if not path.exists():
            raise SpecError(f"`{kind}` = {ref!r}: file not found")
        return read_table(path), str(path)
    raise _unknown(kind, ref, names)


def _preset_once(loader):
    """`loader` with its results for preset names kept (specs are frozen; a file path is read
    every time, it may change)."""
    kind = loader.__name__.removeprefix("load_")
    folder = {"model": "models", "gpu": "gpus", "stack": "stacks"}[kind]
    cached = functools.cache(loader)

    @functools.wraps(loader)
    def load(ref):
        if isinstance(ref, str):  # model names are exact, GPU and stack names any case
            name = ref if kind == "model" else ref.lower()
            if name in _preset_names(folder):
                return cached(name)
        return loader(ref)

    return load


@_preset_once
def load_model(ref: str | ModelSpec) -> ModelSpec:
    """A `ModelSpec` from a preset name, a TOML/JSON file or a Hugging Face config.json."""
    if isinstance(ref, ModelSpec):
        return ref
    data, source = _resolve("model", str(ref), list_models())
    path = Path(str(ref))
    if path.is_dir():  # a snapshot folder: named as its config.json would be
        path = path / "config.json"
    family = ""
    if is_hf_config(data):
        # Name: `_name_or_path`, else the file's own name unless it is `config`, else the
        # model type and size, else the folder name.
        raw = data
        data = hf_config_to_model_dict(
            raw, default_name=None if path.stem == "config" else path.stem, source=source)
        if "name" not in data:
            family = str(text_model_config(raw)[0].get("model_type") or "")
        data.setdefault("name", path.resolve().parent.name or "model")
    data.setdefault("name", path.stem)
    try:
        model = ModelSpec.validate_strict(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"model ({source})")) from None
    if family:
        from ..cost.model_arch import build_arch

        arch = build_arch(model)
        model = model.model_copy(update={"name": size_name(family, arch.n_params, arch.n_params_active)})
    return model


@_preset_once
def load_gpu(ref: str | GPUSpec) -> GPUSpec:
    """A `GPUSpec` from a preset name or a TOML/JSON file."""
    if isinstance(ref, GPUSpec):
        return ref
    data, source = _resolve("gpu", str(ref).lower() if str(ref).lower() in list_gpus() else str(ref), list_gpus())
    try:
        return GPUSpec.validate_strict(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"gpu ({source})")) from None


STACK_TABLES = ("attention", "sources", "profile", "profile_notes")
"""Stack keys holding tables that a stack which `extends` another merges key by key (its own
entries replace the base's: a GPU's profile table, a field's source); any other key it sets
replaces the base's value whole."""


def _extended(data: dict, source: str, seen: tuple[str, ...] = ()) -> dict:
    """A stack table with its `extends` resolved: the named stack preset's table (itself
    resolved the same way) overlaid with this one's keys (`STACK_TABLES` merged key by key).
    One stack's own settings are then declared once, in its own file, and a stack that runs the
    same code with other defaults (NeMo AutoModel on TorchTitan's parallelism) states only what
    differs."""
    base_name = data.pop("extends", None)
    if base_name is None:
        return data
    names = list_stacks()
    if not isinstance(base_name, str) or base_name.lower() not in names:
        close = difflib.get_close_matches(str(base_name).lower(), names, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise SpecError(f"stack ({source}): `extends` = {base_name!r} is not a stack preset.{hint} "
                        f"Presets: {', '.join(names)}")
    base_name = base_name.lower()
    if base_name in seen:
        chain = " -> ".join((*seen, base_name))
        raise SpecError(f"stack ({source}): `extends` runs in a circle ({chain}); a stack may "
                        "extend a preset that does not extend it back")
    base = _extended(copy.deepcopy(_preset_table("stacks", base_name)), f"preset {base_name}",
                     (*seen, base_name))
    merged = {**base, **{k: v for k, v in data.items() if k not in STACK_TABLES}}
    for key in STACK_TABLES:
        if key in data:
            if not isinstance(data[key], dict):
                merged[key] = data[key]  # the spec's own error names the field
            else:
                merged[key] = {**base.get(key, {}), **data[key]}
    return merged


@_preset_once
def load_stack(ref: str | StackSpec) -> StackSpec:
    """A `StackSpec` from a preset name or a TOML/JSON file. A table with `extends = "<preset>"`
    starts from that stack preset and overrides what it sets (`STACK_TABLES` merged key by key;
    `_extended`), e.g. a user's stack file `extends = "megatron-core"` with `grad_dtype = "bf16"`."""
    if isinstance(ref, StackSpec):
        return ref
    names = list_stacks()
    key = str(ref).lower() if str(ref).lower() in names else str(ref)
    data, source = _resolve("stack", key, names)
    own = source.removeprefix("preset ")
    data = _extended(data, source, (own,) if source.startswith("preset ") else ())
    try:
        return StackSpec.validate_strict(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"stack ({source})")) from None


def load_network(ref: str | NetworkSpec) -> NetworkSpec:
    """A `NetworkSpec` from a preset name or a TOML/JSON file."""
    if isinstance(ref, NetworkSpec):
        return ref
    names = list_networks()
    key = str(ref).lower() if str(ref).lower() in names else str(ref)
    data, source = _resolve("network", key, names)
    if source != f"preset {key}":
        data.setdefault("name", Path(str(ref)).stem)
    try:
        return NetworkSpec.validate_strict(data)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"network ({source})")) from None


def load_profile(path: str | Path, base: Profile | None = None) -> Profile:
    """A `Profile` from a TOML/JSON file; keys not in the file keep `base` (or default) values.

    A calibrated profile file may hold its knobs at the top level or under `[profile]`.
    """
    data = read_table(Path(path))
    knobs = data.get("profile", data)
    if not isinstance(knobs, dict):
        raise SpecError(f"{path}: `profile` must be a table of knobs")
    knobs = {k: v for k, v in knobs.items() if k not in {"gpu", "meta"}}
    merged = {**(base.model_dump() if base else {}), **knobs}
    try:
        profile = Profile.validate_strict(merged)
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, f"profile ({path})")) from None
    at_peak = [f"{k} = {getattr(profile, k):.4g}" for k in knobs
               if k.endswith("_efficiency") and getattr(profile, k, 0) >= AT_PEAK]
    if at_peak:
        import warnings

        warnings.warn(f"profile ({path}): {', '.join(at_peak)}: at the physical bound (no "
                      "kernel reaches its peak; measured GEMMs reach 70-87 %), so the plan will "
                      "promise more than any run achieves; refit it on checked measurements",
                      InputWarning, stacklevel=2)
    return profile


AT_PEAK = 0.99
"""An efficiency knob at or above this share of peak in a profile file is warned about: the best
measured GEMMs reach 70-87 % of peak (MAMF, cost-model reference §7.1), attention and collectives
less."""
