#!/bin/bash
#SBATCH --job-name=ap-llama3-70b
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
# autoparallel export: llama3-70b on 64 x h100 (8 nodes x 8 GPUs)
# layout dp2-tp8-pp4-vp5-cp1-ep1-z1-rselective-sp-mb1; seq 8192, global batch 512, 256
#   micro-batches per step per replica
# Megatron-LM derives DP = 64 / (TP 8 x PP 4 x CP 1) = 2 and 256 micro-batches per step itself.
# ZeRO-1: Megatron's distributed optimizer (optimizer state sharded over DP x CP).
# Gradients in fp32 as planned (--accumulate-allreduce-grads-in-fp32).
# Not written here: data, tokenizer (its vocabulary should be 128256), optimizer and schedule;
#   append those Megatron-LM arguments after this script's name (they reach "$@").
# Submit with: sbatch THIS.sh [more Megatron-LM arguments]
set -euo pipefail
# sed reads the whole list: with pipefail, head could fail the script through SIGPIPE
HEAD_NODE=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | sed -n 1p)
export CUDA_DEVICE_MAX_CONNECTIONS=1
srun torchrun --nnodes 8 --nproc-per-node 8 --rdzv-id "$SLURM_JOB_ID" --rdzv-backend c10d \
  --rdzv-endpoint "$HEAD_NODE:29500" pretrain_gpt.py \
  --tensor-model-parallel-size 8 --sequence-parallel \
  --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 4 \
  --context-parallel-size 1 \
  --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
  --ddp-bucket-size 40000000 \
  --recompute-granularity selective --recompute-modules core_attn \
  --micro-batch-size 1 --global-batch-size 512 \
  --seq-length 8192 --max-position-embeddings 8192 \
  --bf16 --accumulate-allreduce-grads-in-fp32 --tp-comm-overlap \
  --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 \
  --num-attention-heads 64 --group-query-attention --num-query-groups 8 \
  --normalization RMSNorm --position-embedding-type rope --rotary-base 500000 --disable-bias-linear \
  --swiglu --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 \
  --make-vocab-size-divisible-by 32 \
  "$@"
