# autoparallel export: llama3-70b on 64 x h100 (8 nodes x 8 GPUs)
# layout dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1; seq 8192, global batch 512, 256
#   micro-batches per step per replica
# TorchTitan 0.3 config module: with this file's folder on PYTHONPATH, torchrun --nnodes 8
#   --nproc-per-node 8 -m torchtitan.train --module THIS_MODULE --config autoparallel_config
# Model: TorchTitan llama3 flavor 70B (llama3-70b).
# ZeRO-1 -> FSDP over dp_shard x cp, reshard "never": TorchTitan has no ZeRO-1 mode, so gradients
#   are sharded too (ZeRO-2 behaviour; memory at most the ZeRO-1 estimate). HSDP is not used: the
#   plan shards over the whole DP x CP group.
# Sequence parallelism is always on with TP in the TOML releases (enable_sequence_parallel in 0.3).
# Selective recompute -> per-op SAC ("op"); it is not Megatron's core-attention recompute, so
#   activation memory and recompute time can differ.
# Gradients: TorchTitan reduces them in float32 (mixed_precision_reduce has no other value) into
#   fp32 shards; the plan assumed bf16, so the gradient reduce-scatter moves twice the bytes the
#   estimate counted.
from torchtitan.config import ParallelismConfig
from torchtitan.distributed.activation_checkpoint import SelectiveAC
from torchtitan.models.llama3.config_registry import llama3_70b


def autoparallel_config():
    """llama3-70b, layout dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1."""
    config = llama3_70b()
    config.training.local_batch_size = 256
    config.training.global_batch_size = 512
    config.training.seq_len = 8192
    config.training.mixed_precision_param = 'bfloat16'
    config.training.mixed_precision_reduce = 'float32'
    config.training.disable_cuda_graphs = True
    config.parallelism = ParallelismConfig(
        data_parallel_replicate_degree=1,
        data_parallel_shard_degree=2,
        fsdp_reshard_after_forward='never',
        tensor_parallel_degree=8,
        pipeline_parallel_degree=4,
        pipeline_parallel_schedule='Interleaved1F1B',
        pipeline_parallel_layers_per_stage=4,
        pipeline_parallel_first_stage_less_layers=0,
        pipeline_parallel_last_stage_less_layers=0,
        pipeline_parallel_microbatch_size=1,
        context_parallel_degree=1,
        enable_sequence_parallel=True,
    )
    config.activation_checkpoint = SelectiveAC.Config()
    return config
