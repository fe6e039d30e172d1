"""Row-wise choice among arrays (np.choose's result), by one gather from their stack."""

from __future__ import annotations

import numpy as np


def pick(index: np.ndarray, choices) -> np.ndarray:
    """Per row i, choices[index[i]][i] (as `np.choose(index, choices)`; scalars broadcast):
    one gather from the stacked choices, several times faster than np.choose on a large table."""
    index = np.asarray(index)
    n = index.size
    stacked = np.stack(np.broadcast_arrays(*choices, index)[:-1]).reshape(len(choices), n)
    return stacked.reshape(-1).take(index.reshape(-1) * n + np.arange(n)).reshape(index.shape)
