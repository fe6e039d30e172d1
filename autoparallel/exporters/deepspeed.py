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
- no ring context parallelism (the `sequence_parallel_size` key is Ulysses all-to-all, §4.1);
- experts are placed by `deepspeed.moe.layer.MoE(ep_size=...)` in the model (§4.1);
- what is recomputed is decided by the model (`activation_checkpointing` only configures
  `deepspeed.checkpointing.checkpoint`, §4.1).
"""

from __future__ import annotations

import json

from ._base import Exporter, Job


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
    if lay.cp > 1:
        reasons.append(
            f"context parallelism (cp = {lay.cp}): DeepSpeed's JSON has no ring context "
            "parallelism (sequence_parallel_size is Ulysses all-to-all; docs/export.md, deepspeed row)")
    if lay.ep > 1:
        reasons.append(
            f"expert parallelism (ep = {lay.ep}): set in the model by "
            "deepspeed.moe.layer.MoE(ep_size=...), not in the JSON (docs/export.md, deepspeed row)")
    if lay.recompute != "none":
        reasons.append(
            f"recompute = {lay.recompute}: the JSON's activation_checkpointing only configures "
            "deepspeed.checkpointing.checkpoint; the model decides what is recomputed "
            "(docs/export.md, deepspeed row): export recompute none and enable recomputation in the model "
            "instead")
    return reasons


def config(job: Job) -> dict:
    """The DeepSpeed config dict."""
    lay = job.layout
    return {
        "train_batch_size": job.problem.training.global_batch,
        "train_micro_batch_size_per_gpu": lay.micro_batch,
        "gradient_accumulation_steps": job.micro_batches,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": lay.zero},
    }


class DeepSpeedExporter(Exporter):
    """DeepSpeed config JSON for pure data parallelism with ZeRO 0-3."""

    name = "deepspeed"
    suffix = ".json"
    summary = "DeepSpeed config JSON (data parallel + ZeRO 0-3 only)"

    def limits(self, job: Job) -> list[str]:
        return deepspeed_limits(job)

    def text(self, job: Job) -> str:
        return json.dumps(config(job), indent=2) + "\n"
