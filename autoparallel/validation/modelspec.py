"""Build a `ModelSpec` from the architecture columns of a measured-run row.

The columns (`layers, hidden, heads, kv_heads, ffn_hidden, vocab`, MoE fields) follow
`shared/data/README.md`. What they do not say is derived, and every derivation is returned as an
assumption string so that the report can count it:

- MLP type: gated (SwiGLU, three h x f matrices) for the Llama/Qwen/DeepSeek/Mixtral/GPT-OSS/
  ChatGLM/Baichuan/Aquila/Phi-3 families, two-matrix (GeLU) for GPT/MPT/BLOOM/OPT/MT-NLG/phi-2/
  StableLM-alpha; a name with no family falls back to whichever matches the stated parameter
  count, and to GeLU when none is stated.
- Tied embeddings: chosen by the stated parameter count (`params_total_b`, or `NumParams=` in the
  notes) when one is given (the untied count is larger by V*h); otherwise from the word "tied" in
  the row's notes; otherwise untied.
- `head_dim N`, `first K layers` (dense layers before the MoE ones), `kv_lora / q_lora` (MLA) are
  read from the notes.
"""

from __future__ import annotations

import re

from pydantic import ValidationError

from ..cost.model_arch import build_arch
from ..errors import format_validation_error
from ..presets import list_models, load_model
from ..specs.model import ModelSpec

GATED = re.compile(r"llama|qwen|deepseek|mixtral|mistral|gpt[- ]?oss|kimi|gemma|glm|baichuan|aquila|"
                   r"phi-?3|moonlight", re.I)
UNGATED = re.compile(r"\bgpt|mpt|bloom|opt\b|mt-nlg|nemotron|phi-2|stablelm", re.I)


class RowSkip(Exception):
    """The row cannot be used; the message is the counted skip reason."""


def _num(row, col):
    v = row.get(col)
    if v is None or (isinstance(v, float) and v != v) or str(v).strip() == "":
        return None
    try:
        return float(v)
    except ValueError:
        raise RowSkip(f"non-numeric `{col}`") from None


def _int(row, col):
    v = _num(row, col)
    if v is None:
        return None
    if v != int(v) or v < 0:
        raise RowSkip(f"`{col}` is not a whole number")
    return int(v)


def _text(row) -> str:
    return " ".join(str(row.get(c) or "") for c in ("notes", "derived_values"))


def stated_params(row) -> float | None:
    """Total parameter count the row states (`NumParams=` in notes, else `params_total_b`)."""
    m = re.search(r"NumParams=(\d+)", _text(row))
    if m:
        return float(m.group(1))
    b = _num(row, "params_total_b")
    return b * 1e9 if b else None


SHAPE_FIELDS = {"layers": "n_layers", "hidden": "hidden_size", "heads": "n_heads",
                "kv_heads": "n_kv_heads", "vocab": "vocab_size"}
"""Row column -> `ModelSpec` field, for matching a row to a packaged preset of its shape."""


def _presets_shaped_like(row, columns: tuple[str, ...]):
    """The packaged presets whose `columns` (keys of `SHAPE_FIELDS`) equal the row's."""
    shape = tuple(_int(row, c) for c in columns)
    for name in list_models():
        spec = load_model(name)
        if tuple(getattr(spec, SHAPE_FIELDS[c]) for c in columns) == shape:
            yield spec


def _mla_from_preset(row) -> tuple[dict, dict, int] | None:
    """MLA dims the row lacks, from a packaged preset with the same shape (DeepSeek-V3): the
    MLA table, the MoE table and the multi-token-prediction modules."""
    for spec in _presets_shaped_like(row, ("layers", "hidden", "heads")):
        if spec.mla is not None:
            return (spec.mla.model_dump(), spec.moe.model_dump() if spec.moe else {},
                    spec.mtp_layers)
    return None


def _twins(row):
    """The packaged presets with the row's shape (layers, hidden size, heads, KV heads,
    vocabulary) and expert count."""
    experts = _int(row, "moe_experts") or 0
    return (spec for spec in _presets_shaped_like(row, tuple(SHAPE_FIELDS))
            if (spec.moe.n_experts if spec.moe else 0) == experts)


def _window_from_preset(row) -> tuple[int, int | None] | None:
    """(sliding window, layers that use it) of the preset of the row's shape (`_twins`), which no
    column of the table carries (gpt-oss: a 128-token window on the alternate half of the layers,
    its HF config.json `sliding_window` and `layer_types`); None when no such preset has one."""
    for spec in _twins(row):
        if spec.sliding_window:
            return spec.sliding_window, spec.n_sliding_layers
    return None


def _code_fields_from_preset(row) -> dict:
    """`linear_bias` and `yarn` of the preset of the row's shape (`_twins`), which no column of
    the table carries (gpt-oss: biased linears and YaRN factor 32, its HF config.json); {} when
    no such preset sets them."""
    for spec in _twins(row):
        out = {"linear_bias": spec.linear_bias} if spec.linear_bias is not None else {}
        if spec.yarn is not None:
            out["yarn"] = spec.yarn.model_dump()
        if out:
            return out
    return {}


def _head_dim_from_preset(row) -> int | None:
    """The head width of a row whose notes give none: that of the packaged preset with the same
    layers, hidden size, heads, KV heads and vocabulary, else None (the caller uses it where it
    is not hidden / heads, e.g. gpt-oss: 64 heads of 64 over a hidden size of 2880)."""
    return next((spec.head_dim for spec in _presets_shaped_like(row, tuple(SHAPE_FIELDS))
                 if spec.head_dim), None)


HYBRID_NAMES = (
    (re.compile(r"nemotron[_ -]?(v?3)[_ -]?nano|nemotron v3 nano", re.I), "nemotron-3-nano"),
    (re.compile(r"nemotron[_ -]?(v?3)[_ -]?super|nemotron v3 super", re.I), "nemotron-3-super"),
    (re.compile(r"nemotron[_ -]?(v?3)[_ -]?ultra|nemotron v3 ultra", re.I), "nemotron-3-ultra"),
    (re.compile(r"nemotron-h[_ -]?8b", re.I), "nemotron-h-8b"),
    (re.compile(r"nemotron-h[_ -]?56b", re.I), "nemotron-h-56b"),
    (re.compile(r"qwen3[_ -]?next[_ -]?80b", re.I), "qwen3-next-80b-a3b"),
)
"""Hybrid models the measured-run table names without architecture columns (the table has no
pattern column): the packaged preset of the same model (its sources in the preset file)."""
UNPUBLISHED_HYBRIDS = re.compile(r"nemotron[_ -]?(v?3)[_ -]?5[_ -]?lightning", re.I)


def hybrid_from_name(name: str) -> tuple[ModelSpec, list[str]] | None:
    """(`ModelSpec`, assumptions) of a hybrid model named by a row, from its preset; None when
    the name is not a known hybrid. Raises `RowSkip` for a hybrid whose architecture the project
    has no source for (Nemotron-3.5 Lightning)."""
    if UNPUBLISHED_HYBRIDS.search(name):
        raise RowSkip("hybrid architecture not in the presets (no published layer pattern)")
    for pattern, preset in HYBRID_NAMES:
        if pattern.search(name):
            return load_model(preset), [f"hybrid architecture from the `{preset}` preset"]
    return None


RECIPE_TOKENIZERS = (
    (re.compile(r"arch: NeMo GPTConfig\d", re.I), 50257,
     "GPT-2 BPE, 50,257 tokens: NeMo's GPT-3 performance scripts tokenize with "
     "nvidia/megatron-gpt2-345m (scripts/llm/performance/pretrain_gpt3_175b.py), the launcher's "
     "GPT-3 configs with GPT2BPETokenizer (launcher_scripts/conf/training/gpt3/*.yaml)"),
    (re.compile(r"arch: NeMo Nemotron[34]Config", re.I), 256000,
     "NullTokenizer of 256,000 tokens: NeMo's Nemotron performance scripts "
     "(scripts/llm/performance/pretrain_nemotron3_8b.py, _22b, nemotron4_15b)"),
)
"""Vocabularies of the NeMo recipes a row names (`arch: NeMo <Config>` in its notes) where the
table prints none: the tokenizer each recipe's performance script sets."""
MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128
"""Megatron pads the vocabulary to a multiple of this x TP (`--make-vocab-size-divisible-by`,
default 128; NeMo's GPTConfig and the launcher configs keep it; megatron/training/tokenizer
`_vocab_size_with_padding`)."""


def vocab_from_recipe(row) -> tuple[int, str] | None:
    """(vocabulary as trained, assumption) of a row whose notes name a NeMo recipe with a known
    tokenizer (`RECIPE_TOKENIZERS`), padded as Megatron pads it for the row's TP; else None."""
    text = _text(row)
    for pattern, vocab, source in RECIPE_TOKENIZERS:
        if pattern.search(text):
            step = MAKE_VOCAB_SIZE_DIVISIBLE_BY * (_int(row, "tp") or 1)
            padded = -(-vocab // step) * step
            return padded, f"vocab {padded} ({source}; padded to a multiple of {step})"
    return None


PRESET_BY_NAME = ((r"\bkimi[ _-]?k2\b", "kimi-k2"),)
"""Rows that name a model with a published config but print no architecture: the preset built
from that config (presets/models/*.toml, each with its Hugging Face source)."""


def model_from_row(row) -> tuple[ModelSpec, list[str]]:
    """(`ModelSpec`, assumptions) for one row; raises `RowSkip` when the columns are incomplete."""
    hybrid = hybrid_from_name(str(row.get("model") or ""))
    if hybrid is not None:  # hybrid models: the table has no pattern column
        return hybrid
    need = {c: _int(row, c) for c in ("layers", "hidden", "heads", "vocab")}
    recipe_vocab = vocab_from_recipe(row) if not need["vocab"] else None
    if recipe_vocab is not None:
        need["vocab"] = recipe_vocab[0]
    missing = [c for c, v in need.items() if not v]
    name = str(row.get("model") or "")
    preset = next((p for pat, p in PRESET_BY_NAME if re.search(pat, name, re.I)), None)
    if missing and preset:
        spec = load_model(preset)
        return spec.model_copy(update={"name": name.strip() or spec.name}), [
            f"architecture from the {preset} preset (the row prints none)"]
    if missing:
        raise RowSkip("architecture incomplete (" + ", ".join(missing) + " missing)")
    text = _text(row)
    name = str(row.get("model") or "model").strip() or "model"
    assumptions: list[str] = [recipe_vocab[1]] if recipe_vocab is not None else []
    spec: dict = {
        "name": name, "n_layers": need["layers"], "hidden_size": need["hidden"],
        "n_heads": need["heads"], "vocab_size": need["vocab"],
    }
    stated = re.search(r"\bdropout\s*(?:=\s*)?(\d*\.?\d+)", text, re.I)
    if stated and float(stated.group(1)) > 0:
        # a dropout the row's notes state, e.g. Megatron-LM's defaults where the launch script
        # sets none (megatron/training/arguments.py: --attention-dropout / --hidden-dropout 0.1)
        spec["dropout"] = True
        assumptions.append(f"dropout {stated.group(1)} (the notes)")
    elif re.search(r"gpt-?2", name, re.I) and not stated:
        # GPT-2's configuration (resid_pdrop = attn_pdrop = 0.1) and Megatron-LM's defaults
        # (--hidden-dropout / --attention-dropout 0.1) keep dropout masks
        spec["dropout"] = True
        assumptions.append("dropout 0.1 (GPT-2 configuration)")
    kv = _int(row, "kv_heads")
    if kv:
        spec["n_kv_heads"] = kv
    m = re.search(r"head_dim (\d+)", text)
    if m:
        spec["head_dim"] = int(m.group(1))
    else:
        head_dim = _head_dim_from_preset(row)
        if head_dim is not None and head_dim * need["heads"] != need["hidden"]:
            spec["head_dim"] = head_dim
            assumptions.append(f"head_dim {head_dim} from the preset of the same shape")
    window = _window_from_preset(row)  # no row of the table prints one
    if window is not None:
        spec["sliding_window"], spec["n_sliding_layers"] = window
        assumptions.append(f"sliding window {window[0]} on {window[1] or 'every'} layers from "
                           "the preset of the same shape")
    code = _code_fields_from_preset(row)
    if code:
        spec |= code
        assumptions.append(f"{' and '.join(sorted(code))} from the preset of the same shape")
    experts, topk = _int(row, "moe_experts"), _int(row, "moe_topk")
    f_e, f = _int(row, "moe_expert_ffn"), _int(row, "ffn_hidden")
    m = re.search(r"(\d+) experts,? top-?k? ?(\d+)", f"{name} {text}", re.I)
    if not experts and m:
        # an MoE stated only in words ("8 experts top-2, ffn 5504"): experts of the FFN width
        experts, topk, f_e = int(m.group(1)), int(m.group(2)), f
        assumptions.append("MoE from the model's description (expert FFN = ffn_hidden)")
    arch_type = str(row.get("arch_type") or "").lower()
    if experts:
        if not (topk and f_e):
            raise RowSkip("architecture incomplete (MoE top-k or expert FFN missing)")
        moe = {"n_experts": experts, "top_k": topk, "expert_ffn_hidden_size": f_e,
               "n_shared_experts": _int(row, "moe_shared_experts") or 0}
        m = re.search(r"first (\d+) layers", text)
        if m:
            moe["n_dense_layers"] = int(m.group(1))
        spec["moe"] = moe
        spec["ffn_hidden_size"] = f or f_e
    elif f:
        spec["ffn_hidden_size"] = f
    else:
        raise RowSkip("architecture incomplete (ffn_hidden missing)")
    if "mla" in arch_type:
        found = _mla_from_preset(row)
        if found is None:
            raise RowSkip("MLA attention dimensions not given")
        spec["mla"], preset_moe, mtp = found
        spec.pop("n_kv_heads", None)
        if "moe" in spec and "n_dense_layers" not in spec["moe"]:
            spec["moe"]["n_dense_layers"] = preset_moe.get("n_dense_layers", 0)
        if "moe" in spec and preset_moe.get("n_groups") and spec["moe"]["n_experts"] == \
                preset_moe.get("n_experts"):
            spec["moe"]["n_groups"] = preset_moe["n_groups"]
            spec["moe"]["topk_groups"] = preset_moe["topk_groups"]
        assumptions.append("MLA head dims from the matching preset")
        # the model's multi-token-prediction modules unless the row says "w/o MTP" (Megatron-
        # Bridge's DeepSeek-V3 recipes train mtp_num_layers = 1 by default)
        if mtp and not re.search(r"w/?o mtp|without mtp|no mtp", f"{name} {text}", re.I):
            spec["mtp_layers"] = mtp
            assumptions.append(f"{mtp} MTP module(s) (the matching preset)")

    family = "swiglu" if GATED.search(name) or re.search(r"swiglu", text, re.I) \
        else "gelu" if UNGATED.search(name) else None
    target = stated_params(row)
    candidates = [(act, tied) for act in (["swiglu", "gelu"] if family is None else [family])
                  for tied in (False, True)]
    pos = float(_int(row, "seq_len") or 0) * need["hidden"]
    scored = []
    for act, tied in candidates:
        try:
            ms = ModelSpec.model_validate({**spec, "activation": act, "tied_embeddings": tied})
        except ValidationError as exc:
            raise RowSkip("architecture invalid: " + format_validation_error(exc, "model")
                          .splitlines()[0]) from None
        # a stated count may include learned positional embeddings (s x h, e.g. llm-foundry's
        # NumParams grows with the sequence length), which the architecture does not model
        n = build_arch(ms).n_params
        dist = min(abs(n - target), abs(n + pos - target)) if target else 0.0
        scored.append((dist, act, tied, ms))
    if target:
        _, act, tied, best = min(scored, key=lambda s: s[0])
        assumptions.append(f"{'tied' if tied else 'untied'} embeddings (parameter count)")
        if family is None:
            assumptions.append(f"{act} MLP (parameter count)")
        return best, assumptions
    tied = bool(re.search(r"\btied\b|embeddings tied", text, re.I)) and "untied" not in text.lower()
    act = family or "gelu"
    if family is None:
        assumptions.append("gelu MLP (no family, no parameter count)")
    assumptions.append(f"{'tied' if tied else 'untied'} embeddings (notes)")
    return next(s[3] for s in scored if s[1] == act and s[2] == tied), assumptions
