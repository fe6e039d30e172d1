"""DeepSpeed: the config JSON (`deepspeed train.py --deepspeed --deepspeed_config ds.json`).

Keys follow launchers.md §4.1 (`deepspeed/runtime/config.py`, `runtime/zero/config.py`):
`train_batch_size`, `train_micro_batch_size_per_gpu`, `gradient_accumulation_steps`,
`bf16.enabled`, `zero_optimization.stage`. DeepSpeed checks `train_batch_size == micro x
accumulation x data-parallel size` (§4.3 `_batch_assertion`).

The JSON only expresses data parallelism with ZeRO 0-3. Everything else is decided by the model
code, so a JSON alone would launch a different layout, and the exporter refuses:
- pipeline stages come from the model's `PipelineModule(num_stages=...)`; no interleaving (§4.1);
- TP exists only as AutoTP for Hugging Face models (no PP, and its batch check counts the raw
  world size, §4.3), not Megatron-style TP;
- context parallelism only as DeepSpeed-Ulysses (the layout's form a2a): `sequence_parallel_size`
  (§4.1), with what the model code must provide (the SP group from
  `UlyssesSPAttentionHF.register_with_transformers`, the sequence-sharding data loader, the loss
  over the shards) in the companion note; the ring, all-gather and hierarchical forms are
  refused with the targets that write them;
- experts are placed by `deepspeed.moe.layer.MoE(ep_size=...)` in the model (§4.1);
- selective recompute: DeepSpeed has no core-attention-only mode; what is recomputed is decided
  by the model (§4.1).

Full recompute is written (`activation_checkpointing`) with a companion note (`notes`): the model
code must checkpoint every layer (Hugging Face `model.gradient_checkpointing_enable()`, or each
block wrapped in `deepspeed.checkpointing.checkpoint`). Everything the cost model assumed is
explicit: `overlap_comm` true (the time model overlaps gradient reduction with backward),
`reduce_bucket_size` / `allgather_bucket_size` (the exposed last bucket it prices) and
`data_types.grad_accum_dtype` (the gradient bytes of the memory ledger).
"""

from __future__ import annotations

import json

from ._base import Exporter, Job, architecture, dp_bucket_params


def deepspeed_limits(job: Job) -> list[str]:
    """Axes the DeepSpeed JSON cannot set."""
    lay, reasons = job.layout, []
    if lay.tp > 1:
        reasons.append(
            f"tensor parallelism (tp = {lay.tp}): DeepSpeed's JSON has only AutoTP for Hugging "
            "Face models, which builds no pipeline and checks the batch against the raw world "
            "size (docs/export.md, deepspeed row)")
    if lay.pp > 1:
        reasons.append(
            f"pipeline parallelism (pp = {lay.pp}{', vp = %d' % lay.vp if lay.vp > 1 else ''}): "
            "stages are built by the model's PipelineModule, not by the JSON, and DeepSpeed has "
            "no interleaved schedule (docs/export.md, deepspeed row)")
    if lay.cp > 1 and lay.cp_form.value != "a2a":
        who = {"ring": "megatron and slurm (--cp-comm-type p2p), torchtitan --target-version 0.2",
               "allgather": "megatron and slurm (--cp-comm-type all_gather), torchtitan, nanotron",
               "a2a+ring": "megatron and slurm (--cp-comm-type a2a+p2p)"}[lay.cp_form.value]
        reasons.append(
            f"context-parallel form {lay.cp_form.value} (cp = {lay.cp}): DeepSpeed's only form is "
            f"Ulysses all-to-all (sequence_parallel_size, form a2a); {who} write it "
            "(docs/export.md, deepspeed row)")
    if lay.ep > 1:
        reasons.append(
            f"expert parallelism (ep = {lay.ep}): set in the model by "
            "deepspeed.moe.layer.MoE(ep_size=...), not in the JSON (docs/export.md, deepspeed row)")
    if lay.etp is not None:
        reasons.append(
            f"expert tensor parallelism etp = {lay.etp} other than tp = {lay.tp}: DeepSpeed-MoE "
            "has no parallel folding (expert TP follows the model's TP, set in the model code); "
            "megatron writes it (--expert-tensor-parallel-size)")
    if lay.recompute == "selective":
        reasons.append(
            "recompute = selective: DeepSpeed has no core-attention-only recompute; the model "
            "decides what is recomputed (docs/export.md, deepspeed row): export recompute full (every layer, "
            "gradient_checkpointing_enable()) or none")
    if lay.optimizer_offload and lay.zero == 0:
        reasons.append("optimizer offload with ZeRO-0: DeepSpeed's offload_optimizer needs "
                       "ZeRO stage 1, 2 or 3 (runtime/zero/config.py)")
    if lay.optimizer_offload not in (0, 1) and lay.zero != 3:
        reasons.append(
            f"optimizer offload of {lay.optimizer_offload:g} of the state with ZeRO-{lay.zero}: "
            "DeepSpeed's offload_optimizer.ratio (a partial offload) is valid only with ZeRO "
            "stage 3 (runtime/zero/offload_config.py); use 1 or zero 3")
    return reasons


GRAD_ACCUM = {"bf16": "bf16", "fp32": "fp32"}
"""`training.grad_dtype` -> `data_types.grad_accum_dtype` (DeepSpeed `runtime/config.py`)."""


def config(job: Job) -> dict:
    """The DeepSpeed config dict."""
    lay, tr = job.layout, job.problem.training
    bucket = dp_bucket_params(job)
    cfg = {
        "train_batch_size": tr.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": job.micro_batches,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": GRAD_ACCUM[tr.grad_dtype]},
        "zero_optimization": {"stage": lay.zero, "overlap_comm": True,
                              "reduce_bucket_size": bucket, "allgather_bucket_size": bucket},
    }
    if lay.cp > 1:
        # DeepSpeed-Ulysses over cp ranks: DeepSpeed takes the data-parallel size as
        # world / sequence_parallel_size (runtime/config.py), the plan's dp
        cfg["sequence_parallel_size"] = lay.cp
    if lay.optimizer_offload:
        # ZeRO-Offload: optimizer state and step on the CPU (offload_config.py;
        # `ratio` < 1 is ZeRO-3's partial offload)
        off = {"device": "cpu", "pin_memory": True}
        if lay.optimizer_offload < 1:
            off["ratio"] = lay.optimizer_offload
        cfg["zero_optimization"]["offload_optimizer"] = off
    if lay.recompute == "full":
        cfg["activation_checkpointing"] = {
            "partition_activations": False, "cpu_checkpointing": False,
            "contiguous_memory_optimization": False, "synchronize_checkpoint_boundary": False}
    return cfg


def notes(job: Job) -> str:
    """The companion note: what the model code and the launch must provide (JSON has no
    comments)."""
    m, lay, arch = job.problem.model, job.layout, architecture(job)
    rope = (f"rotary position embeddings with base (rope_theta) {arch.rope_theta:g}"
            if arch.rope_theta is not None else "learned absolute position embeddings")
    lines = [
        f"DeepSpeed config for {m.name}, layout {lay.slug} ({job.n_gpus} GPUs, "
        f"{job.n_nodes} node(s) x {job.gpus_per_node}).",
        f"Launch: deepspeed --num_nodes {job.n_nodes} --num_gpus {job.gpus_per_node} train.py "
        "--deepspeed --deepspeed_config THIS.json",
        f"The model (Hugging Face config.json): {m.n_layers} layers, hidden {m.hidden_size}, "
        f"{m.n_heads} heads, {m.kv_heads} KV heads, intermediate {m.ffn_hidden_size}, vocab "
        f"{m.vocab_size}, {'SiLU gated MLP' if arch.gated else 'GeLU MLP'}, {arch.norm}, "
        f"{rope}, {'tied' if m.tied_embeddings else 'untied'} embeddings, bf16.",
    ]
    if lay.cp > 1:
        mpu = "deepspeed.runtime.sequence_parallel.ulysses_sp"
        lines += [
            f"Ulysses sequence parallelism over {lay.cp} ranks (sequence_parallel_size {lay.cp}; "
            f"{int(lay.dp)} data-parallel replica(s), DeepSpeed's world / sequence_parallel_size). "
            "The JSON does not build it; the model code must:",
            f"  1. before loading the model, register the Ulysses attention and make the "
            f"groups: mpu = {mpu}.UlyssesSPAttentionHF.register_with_transformers("
            f"model_name_or_path=MODEL, core_attn_implementation='flash_attention_2', "
            f"sequence_parallel_size={lay.cp}, micro_batch_size={lay.micro_batch}, "
            f"seq_length={job.problem.training.seq_len}, seq_length_is_variable=False), which "
            "swaps its wrapper in for that attention, then load the model with "
            "attn_implementation='flash_attention_2' (the same implementation);",
            "  2. pass mpu=mpu to deepspeed.initialize (the data-parallel and sequence-parallel "
            "groups);",
            f"  3. wrap the data loader in {mpu}.UlyssesSPDataLoaderAdapter(dl, sp_rank, "
            "sp_group, sp_world_size, device), which splits each batch's input_ids, "
            "position_ids and labels along the sequence (the batch must carry position_ids "
            "and shifted labels);",
            "  4. average the loss over the sequence shards: each rank's loss covers its "
            "tokens only; weight it by its label tokens and all-reduce over the SP group.",
            f"The model's heads must divide by {lay.cp} (query heads {m.n_heads}, KV heads "
            f"{m.kv_heads}: divisible, or {lay.cp} a multiple of them, which replicates K and V).",
        ]
    if lay.recompute == "full":
        lines.append("Full recompute: the model code must checkpoint every transformer layer, "
                     "e.g. model.gradient_checkpointing_enable() for a Hugging Face model, or "
                     "each block wrapped in deepspeed.checkpointing.checkpoint; the JSON's "
                     "activation_checkpointing only configures that function.")
    return "\n".join(lines) + "\n"


class DeepSpeedExporter(Exporter):
    """DeepSpeed config JSON for pure data parallelism with ZeRO 0-3."""

    optimizer_offload = True

    name = "deepspeed"
    suffix = ".json"
    summary = "DeepSpeed config JSON (data parallel + ZeRO 0-3, Ulysses sequence parallelism)"

    def companion(self, job: Job) -> str:
        return notes(job)

    def limits(self, job: Job) -> list[str]:
        return deepspeed_limits(job)

    def text(self, job: Job) -> str:
        return json.dumps(config(job), indent=2) + "\n"
