"""The job a measured-run row describes, beyond the model: GPU preset, precision recipe, software
stack, ZeRO stage, parallel layout, job overrides, recompute. Each function either
returns what the row says (or allows to derive, recording the assumption) or raises `RowSkip`
with the counted reason. The rules are listed in `runs`' module docstring."""

from __future__ import annotations

import re

from .modelspec import RowSkip, _int, _num


PLAIN_GPU_NAMES = ("gb300", "gb200", "b300", "b200", "mi300x", "a10g", "h800", "h200")
"""Presets a `gpu` column names verbatim (the other presets need a variant check); the first
found wins, so the Grace superchips (GB...) come before their HGX parts."""


def gpu_preset(text: str) -> str:
    """Preset name for the `gpu` column, or raise `RowSkip` (unknown GPU)."""
    t = text.lower()
    if "v100" in t:
        if re.search(r"\b16\s*gb", t):
            raise RowSkip("unknown GPU (V100 16GB: no preset)")
        return "v100-32gb"
    found = next((name for name in PLAIN_GPU_NAMES if name in t), None)
    if found:
        return found
    if "h100" in t:
        if re.search(r"hbm2e|500\s*w|lower-tdp|9[56]\s*gb", t):
            return "h100-96gb"  # the 95/96 GB HBM2e part at 500 W (TorchTitan's hosts)
        return "h100"
    if "a100" in t:
        m = re.search(r"(\d+)\s*gb", t)
        return "a100-40gb" if m and m.group(1) == "40" else "a100-80gb"
    raise RowSkip("unknown GPU" + (f" ({text.split()[0]})" if text.strip() else ""))


def _precision(row, allow_fp16: bool, assumptions: list[str], memory: bool = False) -> str:
    """The precision recipe a row states (`specs.precision`), or raise `RowSkip`. A memory check
    (`memory`) reads an unstated 16-bit precision as BF16: BF16 and FP16 hold the same bytes."""
    p = str(row.get("precision") or "").lower()
    if memory and re.search(r"not stated|^\s*$", p):
        assumptions.append("precision not stated: 16-bit (memory only)")
        return "bf16"
    name = None
    if "nvfp4" in p:
        name = "nvfp4"
    elif "mxfp8" in p or "fp8-mx" in p:
        name = "mxfp8"
    elif "blockwise" in p or "block-wise" in p:
        name = "fp8-blockwise"
    elif re.search(r"(fp8|float8).*\browwise\b", p):
        # torchao's float8 rowwise (one scale per row of each operand, rowwise-scaled GEMMs):
        # the same table measures 26-34 % less throughput than tensorwise on the same layout
        # (torchtitan benchmarks/asyncTP_llama3_h100_2025-06: 70B 599.6 vs 809.8, 8B 3,708.5 vs
        # 5,078.1 tokens/s/GPU), and no recipe here prices it; scoring it as `fp8` (per-tensor)
        # would fit the per-tensor recipe to two recipes at once
        raise RowSkip(f"precision without a recipe ({p}: per-row scaling)")
    elif re.search(r"fp8|float8", p):
        name = "fp8"
    elif re.search(r"fp4|mxfp", p):
        raise RowSkip(f"precision without a recipe ({p})")
    elif "bf16" in p:
        name = "bf16"
    elif "fp16" in p:
        if not allow_fp16:
            raise RowSkip("precision FP16 (use --include-fp16)")
        name = "fp16"
    if name is None:
        raise RowSkip("precision not stated" if not p else f"precision unknown ({p})")
    if name != "bf16":
        assumptions.append(f"precision {name}")
    return name


def _stack(row, assumptions: list[str]) -> str:
    """The stack preset whose `frameworks` patterns match the row's `framework` column, or raise
    `RowSkip` (a framework without a preset)."""
    from ..presets import list_stacks, load_stack

    text = str(row.get("framework") or "")
    for name in STACK_ORDER + tuple(n for n in list_stacks() if n not in STACK_ORDER):
        if any(re.search(pat, text, re.I) for pat in load_stack(name).frameworks):
            assumptions.append(f"stack {name} (from the framework)")
            return name
    raise RowSkip("framework without a stack preset" + (f" ({text.split(' (')[0]})" if text else ""))


STACK_ORDER = ("megatron-legacy", "megatron-bridge", "megatron-core", "nemo-automodel",
               "torchtitan", "fsdp", "nanotron", "deepspeed")
"""Order in which stack patterns are tried (the narrower patterns first: legacy Megatron, then
NVIDIA's tuned recipes before plain Megatron-Core, NeMo AutoModel before the FSDP2 stacks whose
words its framework text also carries)."""


def _zero(row, assumptions: list[str]) -> int:
    m = re.fullmatch(r"\s*sharding stage\s*([0-3])\s*", str(row.get("zero_stage") or ""), re.I)
    if m:  # PaddlePaddle fleet's sharding stage N = ZeRO-N
        return int(m.group(1))
    m = re.fullmatch(r"\s*([0-3])\s*\((gemini|zero[^)]*)\)\s*", str(row.get("zero_stage") or ""), re.I)
    if m:  # "3 (Gemini)": Colossal-AI's chunk-based ZeRO-3
        return int(m.group(1))
    z = _int(row, "zero_stage")
    if z is not None:
        if z > 3:
            raise RowSkip("`zero_stage` not in 0-3")
        return z
    fsdp = str(row.get("fsdp") or "").lower()
    if "shard_grad_op" in fsdp:
        return 2
    if fsdp.startswith(("fsdp", "yes")):
        return 3
    if "yes" in str(row.get("distributed_optimizer") or "").lower():
        return 1
    if "overlap-param-gather" in str(row.get("notes") or ""):
        return 1
    assumptions.append("ZeRO stage not stated: 1 (distributed optimizer)")
    return 1


def _layout(row, n_gpus: int, gbs: int, zero: int, assumptions: list[str]) -> dict:
    tp, pp = _int(row, "tp"), _int(row, "pp")
    cp, vp, ep = (_int(row, c) or 1 for c in ("cp", "vpp", "ep"))
    dp = _int(row, "dp")
    if tp is None or pp is None:
        if zero == 3 and dp == n_gpus:
            tp = tp or 1
            pp = pp or 1
        else:
            raise RowSkip("incomplete layout (tp/pp not stated)")
    if min(tp, pp, cp, vp, ep) < 1:
        raise RowSkip("incomplete layout (a degree is 0)")
    mb = _int(row, "mbs")
    fixed = {f: _int(row, f"setting_{f}") for f in LAYOUT_FIELDS}
    fixed = {f: v for f, v in fixed.items() if v}
    if fixed:  # the degrees the recipe file ran where the table prints others (side table)
        printed = {"pp": pp, "vp": vp, "ep": _int(row, "ep"), "micro_batch": mb}
        said = ", ".join(f"{f.replace('_', '-')} {v} (printed {printed[f] or 'none'})"
                         for f, v in fixed.items())
        pp, vp, mb = fixed.get("pp", pp), fixed.get("vp", vp), fixed.get("micro_batch", mb)
        ep = fixed.get("ep", ep)
        dp = n_gpus // (tp * pp * cp)
        assumptions.append(f"layout from the recipe file (moe_settings.csv): {said}")
    if dp is None:
        dp = n_gpus // (tp * pp * cp)
    if dp * tp * pp * cp != n_gpus:
        raise RowSkip("layout does not multiply to the GPU count")
    ga = _int(row, "grad_accum")
    if not mb and ga and gbs % (dp * ga) == 0:
        mb = gbs // (dp * ga)
        assumptions.append("micro-batch = gbs / (dp x grad_accum)")
    if not mb:
        mb = 1
        assumptions.append("micro-batch not stated: 1")
    if _num(row, "ep") is None and "ep" not in fixed and \
            str(row.get("arch_type") or "").startswith("moe"):
        raise RowSkip("incomplete layout (ep not stated for an MoE run)")
    return dict(dp=dp, tp=tp, pp=pp, vp=vp, cp=cp, ep=ep, zero=zero, micro_batch=mb,
                sp=_sequence_parallel(row, tp, assumptions)) | _offload(row)


def _offload(row) -> dict:
    """Optimizer offload the notes state ("offload: offload_optimizer (CPU)"); parameter offload
    (ZeRO-Infinity `offload_param`, FSDP CPU offload of parameters) is not modelled: skip."""
    text = f"{row.get('notes') or ''} {row.get('fsdp') or ''}".lower()
    if re.search(r"offload_param|fsdp_cpu_offload|cpu offload of params", text):
        raise RowSkip("parameter offload (not modelled)")
    if "offload_optimizer" in text:
        return {"optimizer_offload": 1.0}
    return {}


def _sequence_parallel(row, tp: int, assumptions: list[str]) -> bool | None:
    """Sequence parallelism as the row states it (`sequence_parallel` yes/no, or the notes saying
    the flag is absent from the script); None: the layout default (on with TP)."""
    if tp <= 1:
        return None
    v = str(row.get("sequence_parallel") or "").strip().lower()
    if v.startswith(("yes", "true", "on")):
        return True
    if v.startswith(("no", "false", "off")):
        return False
    text = f"{row.get('notes') or ''} {row.get('derived_values') or ''}".lower()
    if re.search(r"sequence[_ -]parallel not in (the )?script|no --sequence-parallel", text):
        assumptions.append("sequence parallelism off (not in the script)")
        return False
    return None


def _job_overrides(row, stack: str | None = None) -> dict:
    """Job settings a row states beyond its stack's defaults: llm-foundry's "PURE" bf16 mode
    reduces gradients in bf16; TP-communication overlap or its absence as the notes say
    (Megatron `--tp-comm-overlap`, TorchTitan async TP vs vanilla TP)."""
    out = {}
    if "pure" in str(row.get("precision") or "").lower():
        out["grad_reduce_dtype"] = "bf16"
    text = f"{row.get('notes') or ''} {row.get('framework') or ''}".lower()
    if stack and re.search(r"flash[-_ ]?attn|flash attention|flashattn|flash_attn", text) \
            and "no flash" not in text and _eager_default(stack):
        out["attention"] = "flash"  # e.g. Megatron-DeepSpeed with --use-flash-attn-v2
    elif re.search(r"no flash[- ]attn \(v100\)|without flash[- ]att|transformer_impl=local", text):
        out["attention"] = "eager"  # e.g. V100 (no FlashAttention-2), Megatron's local impl
    code = _model_code(row)
    if code:
        out["model_code"] = code
    if re.search(r"--training\.compile|--compile\b|torch\.compile|compile[=:]\s*true", text):
        out["torch_compile"] = True
    amp = f"{row.get('precision') or ''} {text}".lower()
    if re.search(r"torch\.? ?autocast", amp) and "fp32 param" in amp:
        out["autocast"] = True  # fp32 FSDP parameters under torch.autocast (ATorch)
    if "tp-comm-overlap" in text or "async tp" in text or "asynctp" in text:
        out["tp_comm_overlap"] = True
    elif "vanilla tp" in text or "no tp overlap" in text:
        out["tp_comm_overlap"] = False
    return out


OMNI_PATH_GBIT = 100.0
"""Line rate of one Intel Omni-Path (OPA 100 series) link, Gbit/s."""


def network_gbps(row, gpus_per_node: int) -> float | None:
    """Network bandwidth per GPU (GB/s, one direction) that a row's `inter_node_network` states,
    or None where it gives no number: "8x 200 Gb/s HDR InfiniBand per node", "1600 Gbps
    node-node RoCE" (per node), "RDMA 400 Gb/s per GPU", "Omni-Path (4 OPA links)" (BLOOM on
    Jean Zay: 4 x 100 Gb/s per node). A run is priced on the fabric its source names."""
    text = str(row.get("inter_node_network") or "").lower()
    if not text or text == "nan":
        return None
    opa = re.search(r"\((\d+)\s*opa links?\)", text)
    if opa:
        return int(opa.group(1)) * OMNI_PATH_GBIT / 8.0 / gpus_per_node
    rate = re.search(r"(?:(\d+)\s*x\s*)?(\d+(?:\.\d+)?)\s*(gb/s|gbps|gbit/s)", text)
    if not rate:
        return None
    count = int(rate.group(1)) if rate.group(1) else 1
    gbit = count * float(rate.group(2))
    per_gpu = "per gpu" in text
    return gbit / 8.0 if per_gpu else gbit / 8.0 / gpus_per_node


def _eager_default(stack: str) -> bool:
    from ..presets import load_stack

    return any(k == "eager" for k in load_stack(stack).attention.values())


def _model_code(row) -> str | None:
    """The model code the framework names where it may differ from its stack's default: `atorch`
    for ATorch's 3D pipeline, `fused` for Megatron-style layers, `chatglm` for ChatGLM's remote code, `hf` for LitGPT's GPT and Hugging Face transformers
    classes (e.g. ATorch's FSDP on `LlamaForCausalLM`); None otherwise."""
    text = f"{row.get('framework') or ''}".lower()
    if "atorch" in text and "pipelineengine" in text:
        # ATorch 3D: the model's own Hugging Face decoder layers with TP linears and a
        # vocab-parallel cross-entropy (`cost.model_code` "atorch")
        return "atorch"
    if "megatron-style" in text:
        return "fused"  # Megatron-style TP layers with a vocab-parallel cross-entropy
    if "chatglm" in text:
        # ChatGLM's remote code (trust_remote_code): fp32 norms, K/V expanded to every head
        return "chatglm"
    if "litgpt" in text:
        # LitGPT's own GPT: fp32 RMSNorm, unfused RoPE (x cos + rotated x sin), fc_1/fc_2/silu
        # kept apart: the hf accounting (litgpt/model.py)
        return "hf"
    if re.search(r"\bhf\b|hugging ?face|transformers|llamaforcausallm", text) \
            and "nanotron" not in text:
        return "hf"
    return None


def _recompute(row, assumptions: list[str]) -> str | None:
    r = str(row.get("recompute") or "").strip().lower()
    for word in ("full", "selective", "none"):
        if r.startswith(word):
            return word
    if re.search(r"script (has|sets) none", r):
        # the launch script is what ran; a README's words about it are not
        assumptions.append("recompute: none (the script sets none)")
        return "none"
    m = re.search(r"\b(full|selective) (?:activation )?recompute", str(row.get("notes") or ""), re.I)
    if m:
        assumptions.append(f"recompute from the notes: {m.group(1).lower()}")
        return m.group(1).lower()
    side = str(row.get("setting_recompute") or "").strip().lower()
    if side in ("full", "selective", "none"):  # the launch config's (settings side table)
        assumptions.append(f"recompute from the launch config (moe_settings.csv): {side}")
        return side
    return None


LAYOUT_FIELDS = ("pp", "vp", "ep", "micro_batch")
"""Side-table fields that replace a row's printed degrees (any row, dense or MoE): where a
source's table prints a layout its own recipe file contradicts, read by hand with the evidence
in the side table's `source` (`_layout`), or an EP degree a table leaves blank that its linked
launch config states."""
SETTING_FIELDS = ("etp", "moe_dispatcher", "moe_a2a_overlap", "cuda_graphs", "moe_routing",
                  "recompute_modules", "recompute", "zero", "offload_modules") + LAYOUT_FIELDS
"""Fields of the settings side table (`runs.SETTINGS_FILE`): expert TP, dispatcher, overlap, CUDA
graphs, routing and recompute modules mined from the source's launch configs
(benchmarks/mine_bridge_recipes.py), and the ZeRO stage (Megatron-FSDP is ZeRO-3), offloaded
modules, recompute granularity and corrected degrees (`LAYOUT_FIELDS`) of recipes and launch
configs read by hand."""


def moe_settings(row, assumptions: list[str], is_moe: bool = False
                 ) -> tuple[dict, dict, list[str] | None]:
    """(job settings, layout fields, recompute modules) of an MoE run: what the settings side
    table mined from the source's launch configs says (`runs.SETTINGS_FILE`, columns
    `setting_*` of `SETTING_FIELDS`), else what the row's words say: forced balancing
    ("force-balance", "fake balanced ... gate") is `balanced` routing, a "tokendrop" run
    `capacity` routing at factor 1 (the token-drop benchmarks' setting [assumed]; only a model
    marked "(tokendrop)": the footnote "token-dropless unless marked tokendrop" is not a mark),
    "DeepEP" in the framework the deepep dispatcher. A row whose `arch_type` is blank counts as MoE when its model has MoE layers
    (`is_moe`, which the caller sets for the hybrid presets' rows). Every value used is
    counted as an assumption."""
    job: dict = {}
    lay: dict = {}
    mods = None
    text = f"{row.get('notes') or ''} {row.get('framework') or ''} {row.get('model') or ''}".lower()
    arch_type = str(row.get("arch_type") or "").strip().lower()
    if arch_type in ("nan",):
        arch_type = ""
    if not (arch_type.startswith("moe") or (not arch_type and is_moe)):
        return job, lay, mods
    got = {f: str(row.get(f"setting_{f}") or "").strip() for f in SETTING_FIELDS}
    if any(got.values()):
        assumptions.append("MoE settings from the launch config (moe_settings.csv)")
    if got["etp"]:
        lay["etp"] = int(got["etp"])
    for field in ("moe_dispatcher", "cuda_graphs", "moe_routing"):
        if got[field]:
            job[field] = got[field]
    if got["moe_a2a_overlap"]:
        job["moe_a2a_overlap"] = got["moe_a2a_overlap"] == "true"
    if got["zero"]:  # e.g. Megatron-FSDP (optim_grads_params) is ZeRO-3
        lay["zero"] = int(got["zero"])
    if got["offload_modules"]:
        job["offload_modules"] = got["offload_modules"]
    if got["recompute_modules"]:
        from ..specs.layout import RecomputeModule

        known = {m.value for m in RecomputeModule}
        mods = [m for m in got["recompute_modules"].split("+") if m in known] or None
    name = str(row.get("model") or "").lower()
    if re.search(r"\(token ?-?drop\)", name):  # a run the table marks "(tokendrop)"
        job["moe_routing"], job["moe_capacity_factor"] = "capacity", 1.0
        assumptions.append("token-drop run: capacity routing at factor 1 (assumed)")
    elif "moe_routing" not in job and re.search(r"force[- ]balanc|fake balanced", text):
        job["moe_routing"] = "balanced"
        assumptions.append("forced balanced routing (the row's notes)")
    if "moe_dispatcher" not in job and "deepep" in text:
        job["moe_dispatcher"] = "deepep"
        assumptions.append("DeepEP dispatcher (the framework column)")
    if job.get("moe_dispatcher") == "deepep" and _container(row) in NO_DEEPEP_CONTAINERS:
        job["moe_dispatcher"] = "alltoall"
        assumptions.append(f"alltoall dispatcher: no DeepEP in the NeMo {_container(row)} "
                           "container (Megatron-Bridge known issues)")
    return job, lay, mods


NO_DEEPEP_CONTAINERS = frozenset({"26.02"})
"""NeMo containers that ship without DeepEP, so a recipe's DeepEP dispatcher cannot have run in
them: Megatron-Bridge `docs/releases/known-issues.md`, 26.02: "DeepEP is not supported in the
current NeMo framework 26.02 container (nvcr.io/nvidia/nemo:26.02), which results in reduced
DSv3 performance compared to the NeMo framework 25.09 container". The flex dispatcher has no
fallback (`training/flex_dispatcher_backend.py` only switches the recipe's alltoall to flex), so
the run kept the recipe's base dispatcher, alltoall. 26.02.01 (r0.3.1) is not in the list."""


def _container(row) -> str:
    """The NeMo container a Megatron-Bridge table row was measured in ("26.02", "26.02.01"),
    from its `source` ("... (NeMo container 26.02)"), or ""."""
    m = re.search(r"NeMo container (\d+\.\d+(?:\.\d+)?)", str(row.get("source") or ""))
    return m.group(1) if m else ""
