"""TorchTitan: the job-config TOML of the releases that read TOML (up to v0.2.2, Feb 2026).

Keys follow launchers.md §3.2 and `torchtitan/config/job_config.py` of the v0.2.2 wheel
(`[training]`, `[parallelism]`, `[activation_checkpoint]`); checks follow §3.3 and that
release's `distributed/parallel_dims.py`, `distributed/pipeline_parallel.py` and
`models/llama3/infra/parallelize.py`. Run it with `torchrun ... -m torchtitan.train
--job.config_file FILE`. Releases after Feb 2026 take a Python `Trainer.Config` instead (§3.1).

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

from ..specs.layout import Recompute
from ._base import Exporter, Job, comments, recompute_of

RESHARD = {1: "never", 2: "never", 3: "always"}
"""ZeRO stage -> `fsdp_reshard_after_forward`."""
AC_MODE = {Recompute.NONE: "none", Recompute.SELECTIVE: "selective", Recompute.FULL: "full"}
"""autoparallel recompute -> `[activation_checkpoint] mode`."""


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def sections(job: Job) -> dict[str, dict]:
    """The TOML tables, in file order."""
    lay, tr = job.layout, job.problem.training
    pipelined = lay.pp > 1
    # with PP one step runs all M micro-batches of one replica; without PP TorchTitan
    # accumulates gradients over global / (local x DP) = M steps of one micro-batch each
    local = job.micro_batches * lay.micro_batch if pipelined else lay.micro_batch
    training = {"local_batch_size": local, "global_batch_size": tr.global_batch,
                "seq_len": tr.seq_len, "mixed_precision_param": "bfloat16"}
    par = {
        "data_parallel_replicate_degree": lay.dp if lay.zero == 0 else 1,
        "data_parallel_shard_degree": 1 if lay.zero == 0 else lay.dp,
    }
    if lay.zero in RESHARD:
        par["fsdp_reshard_after_forward"] = RESHARD[lay.zero]
    par["tensor_parallel_degree"] = lay.tp
    par["pipeline_parallel_degree"] = lay.pp
    if pipelined:
        par |= {
            "pipeline_parallel_schedule": "Interleaved1F1B" if lay.vp > 1 else "1F1B",
            "pipeline_parallel_layers_per_stage": job.layers_per_virtual_stage,
            "pipeline_parallel_first_stage_less_layers": 0,
            "pipeline_parallel_last_stage_less_layers": 0,
            "pipeline_parallel_microbatch_size": lay.micro_batch,
        }
    par["context_parallel_degree"] = lay.cp
    if job.problem.model.moe is not None:
        par["expert_parallel_degree"] = lay.ep
        par["expert_tensor_parallel_degree"] = lay.tp if lay.ep > 1 else 1
    ac = {"mode": AC_MODE[recompute_of(job)]}
    if recompute_of(job) == Recompute.SELECTIVE:
        ac["selective_ac_option"] = "op"
    return {"training": training, "parallelism": par, "activation_checkpoint": ac}


def notes(job: Job) -> list[str]:
    """Comment lines: how to run it and how the layout maps."""
    lay, m = job.layout, job.problem.model
    zero = {
        0: "ZeRO-0 -> DDP (data_parallel_replicate_degree = DP).",
        1: "ZeRO-1 -> FSDP over dp_shard x cp, reshard \"never\": TorchTitan has no ZeRO-1 mode, "
           "so gradients are sharded too (ZeRO-2 behaviour; memory at most the ZeRO-1 estimate).",
        2: "ZeRO-2 -> FSDP over dp_shard x cp, reshard \"never\" (parameters stay gathered "
           "after forward).",
        3: "ZeRO-3 -> FSDP over dp_shard x cp, reshard \"always\".",
    }[lay.zero]
    lines = [
        "TorchTitan job config for the TOML releases (<= v0.2.2): torchrun --nnodes "
        f"{job.n_nodes} --nproc-per-node {job.gpus_per_node} -m torchtitan.train "
        "--job.config_file THIS.toml",
        zero + " HSDP is not used: the plan shards over the whole DP x CP group.",
    ]
    if lay.tp > 1:
        lines.append("Sequence parallelism is always on with TP in these releases.")
    if recompute_of(job) == Recompute.SELECTIVE:
        lines.append("Selective recompute -> per-op SAC (\"op\"); it is not Megatron's core-"
                     "attention recompute, so activation memory and recompute time can differ.")
    lines.append(f"[model] name/flavor not written: pick the TorchTitan flavor of {m.name} "
                 f"({m.n_layers} layers, hidden {m.hidden_size}, {m.n_heads} heads, "
                 f"{m.kv_heads} KV heads).")
    return lines


def torchtitan_limits(job: Job) -> list[str]:
    """What the TOML releases cannot run among layouts that pass autoparallel's hard rules."""
    lay, reasons = job.layout, []
    seq = job.problem.training.seq_len
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
    divisor = lay.tp * 2 * lay.cp
    if seq % divisor:
        reasons.append(
            f"seq_len ({seq}) must be divisible by tp x 2 x cp = {divisor} (v0.2.2 "
            "parallel_dims.seq_len_divisor)")
    shard = (1 if lay.zero == 0 else int(lay.dp)) * lay.cp
    if lay.ep > 1 and shard % lay.ep:
        reasons.append(
            f"ep = {lay.ep} must divide dp_shard x cp = {shard} (expert mesh efsdp x ep x etp = "
            "dp_shard x cp x tp with etp = tp; docs/export.md, torchtitan row)")
    return reasons


class TorchTitanExporter(Exporter):
    """TorchTitan job-config TOML ([training], [parallelism], [activation_checkpoint])."""

    name = "torchtitan"
    suffix = ".toml"
    summary = "TorchTitan job config TOML (releases <= v0.2.2)"

    def limits(self, job: Job) -> list[str]:
        return torchtitan_limits(job)

    def text(self, job: Job) -> str:
        lines = comments(job.header + notes(job))
        for table, values in sections(job).items():
            lines += ["", f"[{table}]"] + [f"{k} = {_value(v)}" for k, v in values.items()]
        return "\n".join(lines) + "\n"
