"""The cost model costs every row on its own: what it shares between rows to go fast (each
distinct group's collective pricing, blocks of rows, one gather for a row-wise choice) must not
change any row's figures. Checked by costing the same rows in another order, one at a time, and
against numpy's own np.choose."""

from __future__ import annotations

import numpy as np
import pytest

from autoparallel import evaluate, make_problem
from autoparallel.cost.comm import Collective, algorithm_times
from autoparallel.cost.pick import pick
from autoparallel.evaluate import BLOCK_ROWS
from autoparallel.placement import group
from autoparallel.rules import Reject, check_rules
from autoparallel.search.enumerate import enumerate_layouts


def test_pick_is_np_choose():
    rng = np.random.default_rng(7)
    idx = rng.integers(0, 4, 1000)
    choices = [rng.random(1000), np.inf, rng.random(1000) * -1.0, 2.5]
    assert np.array_equal(pick(idx, choices), np.choose(idx, choices))
    assert pick(np.array([1]), [np.array([1.0]), np.array([2.0])])[0] == 2.0


@pytest.mark.parametrize("op", list(Collective))
def test_collectives_priced_per_distinct_group_equal_row_by_row(op):
    # runs of equal (size, stride) are priced once; a row alone is its own run
    p = make_problem("llama3-70b", "h100", 4096, 4096, 512, network="dgx-h100-superpod")
    size = np.repeat([1, 2, 8, 16, 64, 512, 8, 4096], 3).astype(float)
    stride = np.repeat([1, 4, 1, 8, 2, 8, 64, 1], 3).astype(float)
    nbytes = np.linspace(1e3, 4e9, len(size))
    grp = group(size, stride, (8, 256))
    assert grp.runs is not None and len(grp.runs[0].size) == 8
    together = algorithm_times(p, op, nbytes, grp)
    for i in range(len(size)):
        alone = algorithm_times(p, op, nbytes[i:i + 1], group(size[i:i + 1], stride[i:i + 1],
                                                              (8, 256)))
        for k, v in alone.items():
            assert together[k][i] == v[0], (op, k, i)


def test_rows_costed_alike_in_any_order_and_block():
    # more rows than a block, shuffled: other runs, other blocks, the same figures per row
    p = make_problem("mixtral-8x7b", "h100", 256, 4096, 1024)
    table = enumerate_layouts(p)
    assert len(table) > BLOCK_ROWS
    order = np.random.default_rng(3).permutation(len(table))
    a = evaluate(p, table)
    b = evaluate(p, table.take(order))
    # the rule flags too (checked in blocks by threads), with rows that break rules among them
    assert np.array_equal(a.reject[order], b.reject)
    assert (a.reject & ~int(Reject.OOM)).any() and ((a.reject & ~int(Reject.OOM)) == 0).any()
    assert np.array_equal(a.reject & ~int(Reject.OOM), check_rules(p, a.arch, table))
    for name in ("time", "memory"):
        for k, v in getattr(a, name).items():
            assert np.array_equal(v[order], getattr(b, name)[k]), (name, k)
    few = order[:50]
    c = evaluate(p, table.take(few))
    assert np.array_equal(c.time["step"], a.time["step"][few])
    assert np.array_equal(c.memory["total"], a.memory["total"][few])


@pytest.mark.parametrize("n", [1, 97, 32767, 32768, 40000, 131072, 131073, 154224, 609352, 981780])
def test_blocks_cover_the_table_in_equal_parts_that_keep_every_worker_busy(n):
    from autoparallel.evaluate import SPLIT_ROWS, WORKERS, block_size

    size = block_size(n)
    blocks = -(-n // size)
    assert 1 <= size <= BLOCK_ROWS and blocks * size >= n > (blocks - 1) * size
    if n >= WORKERS * SPLIT_ROWS:
        assert blocks >= WORKERS and blocks % WORKERS == 0  # no thread left with one more block
        assert n - (blocks - 1) * size > size // 2  # the last block is not a sliver
    else:
        assert blocks == 1
