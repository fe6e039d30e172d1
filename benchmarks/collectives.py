"""Predicted nccl-tests / rccl-tests bus bandwidths against the published measurements the
collective model is checked on (tests/test_comm.py holds the same figures with tolerances).
Benchmarks print figures; nothing here is asserted.

    python benchmarks/collectives.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from autoparallel import make_problem  # noqa: E402
from autoparallel.cost.comm import Collective, bus_bandwidth  # noqa: E402
from autoparallel.placement import group  # noqa: E402

GIB = 2**30
MEASURED = [
    # (label, gpu, ranks per domain, domains, algorithm, measured GB/s, source)
    ("DGX A100 8x HDR, ring", "a100-80gb", 8, 2, "ring", 192.0, "NVIDIA/nccl #812"),
    ("DGX A100 8x HDR, 4 nodes", "a100-80gb", 8, 4, "chosen", 192.0, "NVIDIA/nccl #812"),
    ("DGX A100 8x HDR, 16 nodes", "a100-80gb", 8, 16, "chosen", 192.0, "NVIDIA/nccl #812"),
    ("DGX H100 8x NDR, ring", "h100", 8, 2, "ring", 380.0, "GTC 2024 via NVIDIA/nccl #1649"),
    ("DGX H100 8x NDR, 8 nodes", "h100", 8, 8, "chosen", 380.0, "GTC 2024 via NVIDIA/nccl #1649"),
    ("4 x 8 B200, 8x400G EFA", "b200", 8, 4, "chosen", 381.8, "ml-engineering network README"),
    ("GB200 NVL4 x 3, ring", "gb200", 4, 3, "ring", 196.72, "NVIDIA/nccl #1801"),
    ("GB200 NVL4 x 3, tree", "gb200", 4, 3, "tree", 234.43, "NVIDIA/nccl #1801"),
    ("GB200 NVL8 x 3, ring", "gb200", 8, 3, "ring", 393.66, "NVIDIA/nccl #1801"),
    ("GB200 NVL8 x 3, tree", "gb200", 8, 3, "tree", 485.68, "NVIDIA/nccl #1801"),
    ("8x H100 NVLS", "h100", 8, 1, "chosen", 478.0, "nccl-tests #212/#290"),
    ("MI300X 2 GPUs", "mi300x", 2, 1, "chosen", 47.671, "ml-engineering network README"),
    ("MI300X 4 GPUs", "mi300x", 4, 1, "chosen", 144.0, "3 x 48 GB/s per xGMI link, AMD ROCm blog"),
    ("MI300X 8 GPUs", "mi300x", 8, 1, "chosen", 312.912, "ml-engineering network README"),
]


def main() -> None:
    print(f"{'all-reduce bus bandwidth, 16 GiB':34s} {'predicted':>10s} {'measured':>9s} {'error':>7s}  source")
    for label, gpu, per, k, algo, measured, source in MEASURED:
        p = make_problem("llama3-8b", gpu, 128, 4096, 512)
        g = group(np.array([per * k * 1.0]), np.array([1.0]), per)
        got = bus_bandwidth(p, Collective.ALL_REDUCE, 16 * GIB, g, algo)[0] / 1e9
        print(f"{label:34s} {got:8.1f}   {measured:8.1f} {got / measured - 1:+7.1%}  {source}")


if __name__ == "__main__":
    main()
