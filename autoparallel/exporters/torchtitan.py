"""TorchTitan: the job config, in the form of the chosen release (`--target-version`):
a Python config module for 0.3 (the current release, `--module`/`--config`, launchers.md §3.1) or
the job-config TOML of the releases that read TOML (up to v0.2.2, Feb 2026; §3.2).

Keys follow launchers.md §3.2 and `torchtitan/config/job_config.py` of the v0.2.2 wheel
(`[training]`, `[parallelism]`, `[activation_checkpoint]`); checks follow §3.3 and that
release's `distributed/parallel_dims.py`, `distributed/pipeline_parallel.py` and
`models/llama3/infra/parallelize.py`. Run it with `torchrun ... -m torchtitan.train
--job.config_file FILE`. Release 0.3.0 (the PyPI wheel) takes a Python function returning a
`Trainer.Config` (`torchtitan/config/manager.py` `ConfigManager._load_config`): the exporter
writes a module whose function starts from the model's registry config (`config_registry.py`,
e.g. `llama3_70b`) and sets `training`, `parallelism` and `activation_checkpoint` with the same
field names as the TOML (`torchtitan/config/configs.py` of the 0.3.0 wheel).

The model travels as TorchTitan's registry name and flavor (`[model] name/flavor`, or the
registry function in 0.3); a model whose shape matches no flavor is refused (TorchTitan builds
models only from its registry).

ZeRO -> FSDP/HSDP mapping (also written in the file):

| ZeRO | TorchTitan |
|---|---|
| 0 | DDP: `data_parallel_replicate_degree = DP`, shard degree 1 (TorchTitan's DDP is 1-D only) |
| 1 | FSDP over dp_shard x cp, `fsdp_reshard_after_forward = "never"` (no ZeRO-1 mode: gradients are sharded too, ZeRO-2 behaviour) |
| 2 | FSDP over dp_shard x cp, `fsdp_reshard_after_forward = "never"` |
| 3 | FSDP over dp_shard x cp, `fsdp_reshard_after_forward = "always"` |

HSDP (replicate > 1 and shard > 1) is never written: autoparallel's ZeRO shards over the whole
DP x CP group, which is plain FSDP here.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ExportError
from ..specs.layout import Recompute, stage_layers_slug
from ._base import Exporter, Job, comments, recompute_of

ROTATE = {"allgather": "allgather", "ring": "alltoall"}
"""Context-parallel form -> `[parallelism] context_parallel_rotate_method` of the TOML releases
(<= v0.2.x): PyTorch's context-parallel SDPA all-gathers K, V once (`allgather`, the default) or
passes them around the ring, one all-to-all permute per step (`alltoall`; `_AllToAllRotater`).
Release 0.3 has no rotate setting and runs PyTorch's default, the all-gather."""
RESHARD = {1: "never", 2: "never", 3: "always"}
"""ZeRO stage -> `fsdp_reshard_after_forward`."""
AC_MODE = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}
"""autoparallel recompute -> `[activation_checkpoint] mode`."""


@dataclass(frozen=True)
class Flavor:
    """A TorchTitan registry model: module (`[model] name`), flavor, 0.3 config function."""

    name: str
    flavor: str
    function: str


FLAVORS = {
    # (layers, hidden, heads, KV heads, FFN, vocab, routed experts) -> registry entry; shapes
    # from torchtitan v0.2.2 models/{llama3,qwen3,deepseek_v3}/__init__.py and the 0.3.0
    # config_registry.py functions of the same flavor
    (32, 4096, 32, 8, 14336, 128256, 0): Flavor("llama3", "8B", "llama3_8b"),
    (80, 8192, 64, 8, 28672, 128256, 0): Flavor("llama3", "70B", "llama3_70b"),
    (126, 16384, 128, 8, 53248, 128256, 0): Flavor("llama3", "405B", "llama3_405b"),
    (48, 2048, 32, 4, 6144, 151936, 128): Flavor("qwen3", "30B-A3B", "qwen3_30b_a3b"),
    (61, 7168, 128, 128, 18432, 129280, 256): Flavor("deepseek_v3", "671B", "deepseek_v3_671b"),
}
"""TorchTitan flavors autoparallel can name, by model shape."""

VERSIONS = {"0.3": "python", "0.2": "toml", "0.1": "toml"}
"""Release line -> config form (0.3.x: Python `Trainer.Config`; <= 0.2.x: TOML)."""
CURRENT = "0.3"
"""The current TorchTitan release line (PyPI torchtitan 0.3.0)."""


def release_line(version: str | None) -> str:
    """`--target-version` (e.g. 0.3, 0.3.0, 0.2.2) -> release line; ExportError otherwise."""
    if version is None:
        return CURRENT
    parts = str(version).strip().split(".")
    line = ".".join(parts[:2])
    if len(parts) < 2 or line not in VERSIONS or not all(p.isdigit() for p in parts[:3]):
        raise ExportError(f"--target-version {version!r} for torchtitan: choose 0.3 (the current "
                          "release, Python config) or 0.2 (<= 0.2.2, TOML), optionally with "
                          "the patch number, e.g. 0.2.2")
    return line


def flavor_of(job: Job) -> Flavor | None:
    """The registry flavor of the job's model, matched by shape; None when none matches."""
    m = job.problem.model
    key = (m.n_layers, m.hidden_size, m.n_heads, m.kv_heads, m.ffn_hidden_size, m.vocab_size,
           m.moe.n_experts if m.moe is not None else 0)
    return FLAVORS.get(key)


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def chunk_layers(job: Job) -> list[int]:
    """Transformer layers per model chunk (TorchTitan's virtual stages, in model order) as the
    layout places them: rank r holds chunks r, r + pp, ..., each with 1/vp of the rank's layers
    (Megatron-Core's interleaved placement, which the cost model prices; `cost/stages.py`)."""
    lay, L = job.layout, job.problem.model.n_layers
    per_rank = lay.stage_layers or [L // lay.pp] * lay.pp
    return [per_rank[v % lay.pp] // lay.vp for v in range(lay.pp * lay.vp)]


def titan_split(n_layers: int, n_chunks: int, first_less: int, last_less: int) -> list[int] | None:
    """Transformer layers per virtual stage that TorchTitan's automatic split gives, or None
    where it raises. Same rule in v0.2.2 `generate_llm_fqn_per_model_part` and 0.3.0
    `_generate_llm_fqn_per_model_part` (`distributed/pipeline_parallel.py`): the embedding counts
    as `first_less` layers and the output as `last_less`; E = L + both effective layers are
    dealt out E // V per stage, the remainder one each to the first stages; the first stage
    then drops `first_less` real layers and the last `last_less`. It raises when a stage would
    be empty or a weight exceeds E // V."""
    if n_chunks == 1:
        return [n_layers]
    eff = n_layers + first_less + last_less
    base, extra = divmod(eff, n_chunks)
    if n_chunks > eff or base == 0 or first_less > base or last_less > base:
        return None
    counts = [base + (v < extra) for v in range(n_chunks)]
    counts[0] -= first_less
    counts[-1] -= last_less
    return counts


def stage_count_option(eff_layers: int, n_chunks: int) -> int | None:
    """A `pipeline_parallel_layers_per_stage` from which TorchTitan derives `n_chunks` virtual
    stages: it takes ceil(E / layers_per_stage) (v0.2.2 `pipeline_llm`, 0.3.0
    `_get_pipeline_metadata`); the value nearest E / V first; None when no value does."""
    guess = -(-eff_layers // n_chunks)
    for lps in [guess] + list(range(1, eff_layers + 1)):
        if -(-eff_layers // lps) == n_chunks:
            return lps
    return None


def split_options(job: Job) -> tuple[int, int, int] | None:
    """(`pipeline_parallel_layers_per_stage`, `..._first_stage_less_layers`,
    `..._last_stage_less_layers`) under which TorchTitan's own split places exactly the layout's
    chunks: (L / V, 0, 0) for an even split; for an uneven one the smallest first/last weights
    that reproduce it (e.g. 126 layers on pp 16 as [7, 8x14, 7]: 8, 1, 1). None when none does
    (TorchTitan shortens only its first and last virtual stage, so an uneven split with vp > 1,
    which shortens every chunk of the first or last rank, is rarely expressible)."""
    L, want = job.problem.model.n_layers, chunk_layers(job)
    if not job.layout.stage_layers:
        return job.layers_per_virtual_stage, 0, 0
    found = []
    for first_less in range(max(want) + 2):
        for last_less in range(max(want) + 2):
            if titan_split(L, len(want), first_less, last_less) != want:
                continue
            eff = L + first_less + last_less
            lps = stage_count_option(eff, len(want))
            if lps is not None:
                # prefer weights that leave no remainder (every stage E / V, as the config
                # reads), then the smallest
                found.append(((eff % len(want) != 0, first_less + last_less, first_less),
                              (lps, first_less, last_less)))
    return min(found)[1] if found else None


def split_reasons(job: Job, line: str) -> list[str]:
    """Why TorchTitan (release line `line`) cannot place the layout's uneven split, if so."""
    lay = job.layout
    if not lay.stage_layers:
        return []
    split = stage_layers_slug(lay.stage_layers)[1:-1]
    if line == "0.1":
        return [f"uneven pipeline split [{split}]: TorchTitan 0.1 has no first/last-stage layer "
                "options (pipeline_parallel_first/last_stage_less_layers arrived in v0.2.0); use "
                "--target-version 0.2 or 0.3, or megatron or slurm "
                "(--decoder-first/last-pipeline-num-layers)"]
    if split_options(job) is None:
        chunks = stage_layers_slug(chunk_layers(job))[1:-1]
        why = (f"with vp = {lay.vp} the layout's model chunks hold [{chunks}] layers, and "
               "TorchTitan shortens only its first and last virtual stage"
               if lay.vp > 1 else "TorchTitan deals the layers out evenly, extra ones to the "
               "first stages, then shortens only the first and last stage")
        return [f"uneven pipeline split [{split}]: no pipeline_parallel_first/last_stage_less_"
                f"layers reproduce it ({why}); megatron and slurm write it "
                "(--decoder-first/last-pipeline-num-layers)"]
    return []


def sections(job: Job) -> dict[str, dict]:
    """The TOML tables, in file order."""
    lay, tr = job.layout, job.problem.training
    pipelined = lay.pp > 1
    # with PP one step runs all M micro-batches of one replica; without PP TorchTitan
    # accumulates gradients over global / (local x DP) = M steps of one micro-batch each
    local = job.micro_batches * lay.micro_batch if pipelined else lay.micro_batch
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch,
                "seq_len": tr.seq_len, "mixed_precision_param": "bfloat16",
                "mixed_precision_reduce": "float32"}
    par = {
        "data_parallel_replicate_degree": lay.dp if lay.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if lay.zero == 0 else lay.dp,
    }
    if lay.zero in RESHARD:
        par["fsdp_reshard_after_forward"] = RESHARD[lay.zero]
    par["tensor_parallel_degree"] = lay.tp
    par["pipeline_parallel_degree"] = lay.pp
    if pipelined:
        per_stage, first_less, last_less = split_options(job)
        par |= {
            "pipeline_parallel_schedule": "Interleaved1F1B" if lay.vp > 1 else "1F1B",
            "pipeline_parallel_layers_per_stage": per_stage,
            "pipeline_parallel_first_stage_less_layers": first_less,
            "pipeline_parallel_last_stage_less_layers": last_less,
            "pipeline_parallel_microbatch_size": lay.micro_batch,
        }
    par["context_parallel_degree"] = lay.cp
    if lay.cp > 1 and lay.cp_form.value in ROTATE:
        # the TOML releases' K, V exchange (0.3 has no such setting: its default all-gather)
        par["context_parallel_rotate_method"] = ROTATE[lay.cp_form.value]
    if job.problem.model.moe is not None:
        par["expert_parallel_degree"] = lay.ep
        par["expert_tensor_parallel_degree"] = lay.expert_tp if lay.ep > 1 else 1
    ac = {"mode": AC_MODE[recompute_of(job)]}
    if recompute_of(job) == Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    return {"training": training, "parallelism": par, "activation_checkpoint": ac}


def notes(job: Job, line: str) -> list[str]:
    """Comment lines: how to run it and how the layout maps."""
    lay, m, fl = job.layout, job.problem.model, flavor_of(job)
    zero = {
        0: "ZeRO-0 -> DDP (data_parallel_replicate_degree = DP).",
        1: "ZeRO-1 -> FSDP over dp_shard x cp, reshard \"never\": TorchTitan has no ZeRO-1 mode, "
           "so gradients are sharded too (ZeRO-2 behaviour; memory at most the ZeRO-1 estimate).",
        2: "ZeRO-2 -> FSDP over dp_shard x cp, reshard \"never\" (parameters stay gathered "
           "after forward).",
        3: "ZeRO-3 -> FSDP over dp_shard x cp, reshard \"always\".",
    }[lay.zero]
    run = f"torchrun --nnodes {job.n_nodes} --nproc-per-node {job.gpus_per_node} -m torchtitan.train"
    if VERSIONS[line] == "toml":
        how = ("TorchTitan job config for the TOML releases (<= v0.2.2): "
               f"{run} --job.config_file THIS.toml")
    else:
        how = (f"TorchTitan {line} config module: with this file's folder on PYTHONPATH, {run} "
               f"--module THIS_MODULE --config {CONFIG_FUNCTION}")
    lines = [
        how,
        f"Model: TorchTitan {fl.name} flavor {fl.flavor} ({m.name}).",
        zero + " HSDP is not used: the plan shards over the whole DP x CP group.",
    ]
    if lay.tp > 1:
        lines.append("Sequence parallelism is always on with TP in the TOML releases "
                     "(enable_sequence_parallel in 0.3).")
    if lay.stage_layers:
        _, first_less, last_less = split_options(job)
        lines.append(f"Uneven split {stage_layers_slug(lay.stage_layers)} layers per stage: "
                     f"TorchTitan weighs the embedding as {first_less} and the output as "
                     f"{last_less} transformer layers (pipeline_parallel_first/last_stage_less_"
                     "layers) and deals out the rest evenly, which places exactly these.")
    if recompute_of(job) == Recompute.SELECTIVE:
        lines.append("Selective recompute -> per-op SAC (\"op\"); it is not Megatron's core-"
                     "attention recompute, so activation memory and recompute time can differ.")
    if job.problem.training.grad_dtype == "bf16":
        lines.append("Gradients: TorchTitan reduces them in float32 (mixed_precision_reduce has no "
                     "other value) into fp32 shards; the plan assumed bf16, so the gradient "
                     "reduce-scatter moves twice the bytes the estimate counted.")
    return lines


def expert_reasons(job: Job, line: str) -> list[str]:
    """The expert grid each release builds. 0.2.x: the sparse mesh (pp, dp_replicate, efsdp,
    ep, etp) with efsdp = dp_shard x cp x tp / (etp x ep) and, with EP, ETP = TP or 1 only
    (v0.2.2 `parallel_dims.py` `_validate`: "Currently we only support ETP=TP or ETP=1").
    0.3: the sparse mesh (pp, dp_replicate, efsdp, ep), efsdp = dp_shard x cp x tp / ep ("EP
    borrows ranks from FSDP and TP", 0.3.0 `configs.py` expert_parallel_degree): experts are not
    tensor-parallel with EP (ETP = 1); without EP they follow TP."""
    lay = job.layout
    if job.problem.model.moe is None:
        return []
    etp, shard = lay.expert_tp, (1 if lay.zero == 0 else int(lay.dp)) * lay.cp
    dense = shard * lay.tp
    out = []
    if lay.ep == 1 and etp != lay.tp:
        out.append(f"etp = {etp} with ep = 1: TorchTitan's experts follow TP ({lay.tp}) when "
                   "expert parallelism is off; use etp = tp, or megatron "
                   "(--expert-tensor-parallel-size)")
    elif lay.ep > 1 and line == "0.3" and etp != 1:
        out.append(f"etp = {etp} with ep = {lay.ep}: TorchTitan 0.3 borrows EP from dp_shard x "
                   "cp x tp and does not shard experts over TP (ETP = 1; 0.3.0 configs.py); use "
                   "etp = 1, --target-version 0.2.2 (ETP = TP or 1), or megatron")
    elif lay.ep > 1 and etp not in (1, lay.tp):
        out.append(f"etp = {etp} with ep = {lay.ep}: TorchTitan {line} supports ETP = TP "
                   f"({lay.tp}) or 1 only (v0.2.2 parallel_dims.py); megatron writes any etp")
    elif lay.ep > 1 and dense % (lay.ep * (etp if line != "0.3" else 1)):
        group = lay.ep * (etp if line != "0.3" else 1)
        out.append(f"{'etp x ' if line != '0.3' else ''}ep = {group} must divide dp_shard x cp x "
                   f"tp = {dense} (expert mesh efsdp x ep{' x etp' if line != '0.3' else ''} = "
                   "dp_shard x cp x tp; docs/export.md, torchtitan row)")
    return out


def moe_setting_reasons(job: Job, line: str) -> list[str]:
    """The job's MoE settings this export cannot write: a DeepEP / HybridEP / allgather
    dispatcher (0.3 picks the comm backend where the model registry builds the model,
    `model_registry(flavor, moe_comm_backend=...)`, which the module does not rebuild; the TOML
    lines name it differently across releases), capacity routing (TorchTitan's MoE is dropless),
    the EP all-to-all overlap, and forced balancing on the TOML lines (0.3's
    `debug.moe_force_load_balance` is written)."""
    tr, out = job.problem.training, []
    if job.problem.model.moe is None:
        return out
    if tr.moe_dispatcher != "alltoall":
        out.append(f"the {tr.moe_dispatcher} dispatcher: this TorchTitan export keeps the model "
                   "registry's standard all-to-all (0.3: model_registry(flavor, "
                   "moe_comm_backend=...) sets it); use megatron (--moe-token-dispatcher-type) "
                   "or --moe-dispatcher alltoall")
    if tr.moe_routing == "capacity":
        out.append("capacity routing (token dropping): TorchTitan's MoE is dropless; use "
                   "megatron (--moe-expert-capacity-factor) or another --moe-routing")
    if tr.moe_a2a_overlap:
        out.append("the EP all-to-all overlap: TorchTitan has no such setting; use megatron "
                   "(--overlap-moe-expert-parallel-comm) or --no-moe-a2a-overlap")
    if tr.cuda_graphs != "none" and VERSIONS[line] == "python":
        out.append(f"{tr.cuda_graphs} CUDA graphs of an MoE model: TorchTitan 0.3 captures them "
                   "only with a dispatcher without CPU synchronization (HybridEP with a "
                   "non-blocking capacity factor, MinimalAsyncEP), not the standard all-to-all "
                   "this export keeps; use megatron (--cuda-graph-impl) or --cuda-graphs none")
    if tr.moe_routing == "balanced" and VERSIONS[line] != "python":
        out.append(f"forced-balanced routing: the {line} TOML's field for it moved between "
                   "releases; use the 0.3 module (debug.moe_force_load_balance) or megatron "
                   "(--moe-router-force-load-balancing)")
    return out


def torchtitan_limits(job: Job, line: str = CURRENT) -> list[str]:
    """What TorchTitan (release line `line`) cannot run among layouts that pass autoparallel's
    hard rules."""
    lay, reasons, m = job.layout, [], job.problem.model
    if flavor_of(job) is None:
        known = ", ".join(f"{f.name} {f.flavor}" for f in FLAVORS.values())
        reasons.append(
            f"no TorchTitan flavor has the shape of {m.name} ({m.n_layers} layers, hidden "
            f"{m.hidden_size}, {m.n_heads}/{m.kv_heads} heads, FFN {m.ffn_hidden_size}, vocab "
            f"{m.vocab_size}): TorchTitan builds models from its registry ({known})")
    seq = job.problem.training.seq_len
    reasons += moe_setting_reasons(job, line)
    if lay.tp > 1 and not lay.sp:
        reasons.append(
            f"tp = {lay.tp} without sequence parallelism: TorchTitan's TOML releases always "
            "shard the sequence with TP (docs/export.md, torchtitan row); use sp on")
    if lay.zero == 0 and lay.cp > 1:
        reasons.append(
            "ZeRO-0 with cp > 1: TorchTitan always applies FSDP over dp_shard x cp when CP is "
            "on (v0.2.2 parallel_dims.py); use zero 1-3")
    elif lay.zero == 0 and lay.dp > 1 and (lay.tp > 1 or lay.pp > 1):
        reasons.append(
            "ZeRO-0 (DDP) with tp or pp > 1: TorchTitan's DDP is 1-D only (\"DDP has not "
            "supported > 1D parallelism\", v0.2.2 parallelize.py); use zero 1-3")
    if lay.cp > 1:
        form = lay.cp_form.value
        expressible = ("allgather",) if VERSIONS[line] == "python" else tuple(ROTATE)
        if form not in expressible:
            who = {"ring": "megatron and slurm (--cp-comm-type p2p), torchtitan "
                           "--target-version 0.2 (context_parallel_rotate_method = \"alltoall\")",
                   "a2a": "megatron and slurm (--cp-comm-type a2a), deepspeed "
                          "(sequence_parallel_size, without tp and pp)",
                   "a2a+ring": "megatron and slurm (--cp-comm-type a2a+p2p "
                               "--hierarchical-context-parallel-sizes)"}[form]
            have = ("only all-gathers K and V (PyTorch's default rotate method; 0.3 has no "
                    "rotate setting)" if VERSIONS[line] == "python" else
                    "exchanges K and V by all-gather or around the ring only")
            reasons.append(f"context-parallel form {form}: TorchTitan {line} {have}; {who} "
                           "write it")
    divisor = lay.tp * 2 * lay.cp
    if seq % divisor:
        reasons.append(
            f"seq_len ({seq}) must be divisible by tp x 2 x cp = {divisor} (v0.2.2 "
            "parallel_dims.seq_len_divisor)")
    return reasons


NOT_IN_03 = {"expert_tensor_parallel_degree", "context_parallel_rotate_method"}
"""TOML keys the 0.3.0 `ParallelismConfig` no longer has (with EP its experts take no TP, ETP =
1; without EP they follow TP: `expert_reasons`; K and V are all-gathered, no rotate setting)."""
CONFIG_FUNCTION = "autoparallel_config"
"""Name of the function the 0.3 module defines (`--config`)."""
AC_CLASS = {Recompute.NONE: "None", Recompute.SELECTIVE: "SelectiveAC.Config()",
            Recompute.FULL: "FullAC.Config()"}
"""autoparallel recompute -> 0.3 `activation_checkpoint` value (per-op SAC, whole block, off)."""


def toml_text(job: Job) -> str:
    """The <= 0.2.x job-config TOML."""
    fl = flavor_of(job)
    lines = comments(job.header + notes(job, "0.2"))
    tables = {"model": {"name": fl.name, "flavor": fl.flavor}} | sections(job)
    for table, values in tables.items():
        lines += ["", f"[{table}]"] + [f"{k} = {_value(v)}" for k, v in values.items()]
    return "\n".join(lines) + "\n"


def python_text(job: Job) -> str:
    """The 0.3 config module: the registry config of the model with the layout applied."""
    fl, sec = flavor_of(job), sections(job)
    par = {k: v for k, v in sec["parallelism"].items() if k not in NOT_IN_03}
    if "tensor_parallel_degree" in par:
        par = {**par, "enable_sequence_parallel": True}
    ac = AC_CLASS[recompute_of(job)]
    imports = ["from torchtitan.config import ParallelismConfig"]
    if ac != "None":
        imports.append("from torchtitan.distributed.activation_checkpoint import "
                       + ac.split(".")[0])
    body = imports + [
        f"from torchtitan.models.{fl.name}.config_registry import {fl.function}",
        "",
        "",
        f"def {CONFIG_FUNCTION}():",
        f'    """{job.problem.model.name}, layout {job.layout.slug}."""',
        f"    config = {fl.function}()",
    ]
    training = dict(sec["training"])
    if job.layout.pp > 1:  # 0.3.0 validation: "CUDA graphs do not support pipeline parallelism"
        training["disable_cuda_graphs"] = True
    if job.problem.model.moe is not None and job.problem.training.cuda_graphs == "none":
        # as planned (no graphs), and as 0.3.0 requires of the standard all-to-all dispatcher
        # (trainer.py: "CUDA graphs support only expert parallel token dispatcher
        # configurations without CPU synchronization")
        training["disable_cuda_graphs"] = True
    body += [f"    config.training.{k} = {v!r}" for k, v in training.items()]
    body.append("    config.parallelism = ParallelismConfig(")
    body += [f"        {k}={v!r}," for k, v in par.items()]
    body += ["    )", f"    config.activation_checkpoint = {ac}"]
    if job.problem.model.moe is not None and job.problem.training.moe_routing == "balanced":
        # tokens forced round-robin over the experts, as the plan costed them (0.3.0 configs.py
        # DebugConfig.moe_force_load_balance)
        body.append("    config.debug.moe_force_load_balance = True")
    body.append("    return config")
    return "\n".join(comments(job.header + notes(job, "0.3")) + body) + "\n"


class TorchTitanExporter(Exporter):
    """TorchTitan job config: the 0.3 Python module, or the <= 0.2.x TOML."""

    name = "torchtitan"

    def __init__(self, version: str | None = None):
        self.line = release_line(version)
        self.suffix = ".toml" if VERSIONS[self.line] == "toml" else ".py"
        self.summary = (f"TorchTitan {self.line} config "
                        + ("TOML (releases <= v0.2.2)" if self.suffix == ".toml" else
                           "module (Python, --module/--config)"))

    uneven_splits = True  # where TorchTitan's split reproduces it; `split_reasons` refuses the rest

    def limits(self, job: Job) -> list[str]:
        return (split_reasons(job, self.line) + torchtitan_limits(job, self.line)
                + expert_reasons(job, self.line))

    def text(self, job: Job) -> str:
        return toml_text(job) if self.suffix == ".toml" else python_text(job)
