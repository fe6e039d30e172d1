"""What communication costs when it overlaps compute (shared by the dense and the MoE time terms).

Hidden communication is not free: NCCL's kernels occupy SMs while they run, so compute slows by
`Profile.overlap_sm_fraction` of the hidden time (24 of 132 H100 SMs for an all-gather, NVIDIA
developer forum thread 337991); what does not fit in the compute window is exposed in full."""

from __future__ import annotations

import numpy as np


def exposed_share(prof, overlap: float) -> float:
    """Cost of communication of which `overlap` is hidden: the exposed part plus the SMs the
    hidden part takes from compute (`Profile.overlap_sm_fraction`)."""
    return (1.0 - overlap) + overlap * prof.overlap_sm_fraction


def hidden_cost(prof, comm, window):
    """Seconds `comm` adds when it may hide behind `window` of compute: what does not fit is
    exposed, what fits still slows compute by the SM share NCCL takes."""
    exposed = np.maximum(0.0, comm - window)
    return exposed + prof.overlap_sm_fraction * (comm - exposed)
