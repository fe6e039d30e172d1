"""When nothing fits: what would, found by searching again (not guessed).

`next_steps` re-plans the problem with the memory savers the search left out (activation and
optimizer offload) and with more GPUs (doubling the count until a layout fits), and reports the
fastest layout each finds. Only changes that were actually searched and fit are named."""

from __future__ import annotations

from ..errors import AutoParallelError
from ..limits import MAX_GPUS

MAX_DOUBLINGS = 8
"""Most GPU-count doublings tried (8 -> 2,048): each is a full search."""


def _best(res) -> str:
    rec = res.records()[0]
    return (f"{rec['slug']}, {rec['time_s']['step']:.3g} s per step, MFU "
            f"{rec['mfu'] * 100:.0f}%")


def next_steps(result, rules=None) -> list[str]:
    """Lines such as '--offload fits: dp1-tp8-...-ao40-oo100, 61 s per step, MFU 24%' and
    '16 GPUs fit (--gpus 16): ...' for a plan where nothing fits (`result.n_fit == 0`); empty
    when nothing was found (or the plan fits)."""
    from ..problem import with_gpu_count
    from .plan import plan

    if result.n_fit:
        return []
    p, space = result.problem, result.space
    out = []
    if not space.offload_auto and space.optimizer_offload is None and space.offload_layers is None:
        saver = space.narrowed(optimizer_offload=[0.0, 0.5, 1.0], offload_auto=True)
        try:
            res = plan(p, saver, top=1, keep=0, rules=rules, target=result.target)
        except AutoParallelError:
            res = None
        if res is not None and res.n_fit:
            out.append(f"--offload fits (activation and optimizer offload to host memory): "
                       f"{_best(res)}")
    n = p.cluster.n_gpus
    for _ in range(MAX_DOUBLINGS):
        n *= 2
        if n > MAX_GPUS:
            break
        try:
            res = plan(with_gpu_count(p, n), space, top=1, keep=0, rules=rules,
                       target=result.target)
        except AutoParallelError:
            break
        if res.n_fit:
            nodes = n // p.cluster.gpus_per_node
            out.append(f"{n:,} GPUs fit (--gpus {n}, {nodes:,} nodes of "
                       f"{p.cluster.gpus_per_node}; {n // 2:,} do not): {_best(res)}")
            break
    return out


__all__ = ["MAX_DOUBLINGS", "next_steps"]
