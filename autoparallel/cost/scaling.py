"""Back-of-envelope totals from the seed: 6ND training FLOPs and time at a given MFU."""

from __future__ import annotations


def six_nd(n_params: float, tokens: float) -> float:
    """Training FLOPs ~ 6 N D: 2N forward + 4N backward per token (seed, "The time model";
    Kaplan et al. 2020)."""
    return 6.0 * n_params * tokens


def training_time_s(flops: float, n_gpus: int, peak_flops_per_gpu: float, mfu: float) -> float:
    """T = FLOPs / (GPUs x peak x MFU) (seed, "The time model")."""
    return flops / (n_gpus * peak_flops_per_gpu * mfu)
