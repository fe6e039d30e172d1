"""The Pareto frontier of two costs to minimise (step time and memory), shared by `pareto` and
the plan plot."""

from __future__ import annotations

import numpy as np


def pareto_front(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Indices of the points not dominated when minimising both x and y (sorted by x)."""
    order = np.lexsort((y, x))
    best_y = np.minimum.accumulate(y[order])
    keep = np.ones(len(order), dtype=bool)
    keep[1:] = y[order][1:] < best_y[:-1]
    return order[keep]
