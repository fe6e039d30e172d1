"""Pipelines as experts run them: uneven stage splits, schedules (1F1B, interleaved, ZB-H1, ZB-V,
DualPipe, DualPipeV), their bubbles and in-flight micro-batches, exports, published layouts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from autoparallel import Layout, estimate, make_problem
from autoparallel.specs.layout import Schedule
from autoparallel.cost.model_arch import build_arch
from autoparallel.cost.stages import _held
from autoparallel.cost.time import pipeline_bubble
from autoparallel.errors import ExportError, SpecError
from autoparallel.evaluate import evaluate
from autoparallel.exporters import render
from autoparallel.layouts import LayoutTable
from autoparallel.search.enumerate import enumerate_layouts
from autoparallel.search.plan import plan
from autoparallel.search.space import SearchSpace
from autoparallel.splits import balanced_splits, output_weight

BLOOM = str(Path(__file__).parent / "data" / "bloom-176b.toml")


# ---------------------------------------------------------------- even split = today's numbers

@pytest.mark.parametrize("model,n,seq,batch", [
    ("llama3-8b", 64, 4096, 256), ("llama3-70b", 256, 8192, 512), ("qwen3-30b-a3b", 512, 4096, 1024),
])
def test_explicit_even_split_reproduces_the_even_numbers_exactly(model, n, seq, batch):
    # every enumerated even-split row, costed again with its even split spelled out as
    # first/last layer counts (the uneven code path): every ledger item identical to the bit
    p = make_problem(model, "h100", n, seq, batch)
    L = p.model.n_layers
    t = enumerate_layouts(p, SearchSpace(uneven=False))
    t = t.take(np.flatnonzero((L % t["pp"] == 0) & (t["pp"] > 1)))
    assert len(t) > 100
    per = L // t["pp"]
    cols = dict(t.columns)
    spelled = LayoutTable({**cols, "lf": per, "ll": per}, L)
    a, b = evaluate(p, t), evaluate(p, spelled)
    for k in a.memory:
        assert np.array_equal(a.memory[k], b.memory[k]), k
    for k in a.time:
        assert np.array_equal(a.time[k], b.time[k]), k
    assert np.array_equal(a.reject, b.reject)


def test_default_schedule_slugs_and_json_unchanged():
    lay = Layout(dp=2, tp=4, pp=2, vp=2, zero=1, sp=True)
    assert lay.slug == "dp2-tp4-pp2-vp2-cp1-ep1-z1-rnone-sp-mb1"
    assert Layout.from_slug(lay.slug) == lay


# ---------------------------------------------------------------- uneven splits

def test_balanced_split_of_llama_405b_on_pp16_is_metas():
    # Llama 3 paper (arXiv 2407.21783 §3.3.2): 126 layers on PP16, first and last stage one
    # layer short; the output layer weighs ~0.63 layer of FLOPs (2hV vs 2 x 3.2e9 + s a (2 d))
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    w = output_weight(build_arch(p.model), 8192)
    assert w == pytest.approx(0.6326, abs=1e-3)
    assert balanced_splits(126, 16, 1, w)[0] == (7, 7)
    # vp 2, 4, 8: the ends need not divide by vp (Megatron-Core's embedding/loss accounting,
    # (126 + 2) / 16 = 8 per rank, one fewer in rank 0's first and rank 15's last chunk, is
    # Megatron-Bridge's 405B recipe); [7, 8x14, 7] and [8, 8x14, 6] both load 8 at most, and the
    # first is flatter: 7^2 + 7.63^2 = 107.3 < 8^2 + 6.63^2 = 108.0
    for vp in (2, 4, 8):
        assert balanced_splits(126, 16, vp, w)[:2] == [(7, 7), (8, 6)]
    # an even split that already balances yields nothing better on pp 2 (63 + 63.63)
    assert balanced_splits(126, 2, 1, w) == []


def test_layouts_without_a_split_take_the_one_plan_takes():
    """`with_default_split` is the single entry point (estimate, estimate --input, plan
    --versus, export, tune, the Python API): where pp x vp does not divide the layers it fills in
    the split plan's enumerator keeps for that (pp, vp), and leaves every other layout alone."""
    from autoparallel import api
    from autoparallel.splits import default_split, with_default_split

    # DeepSeek-V3 (61 layers) without its MTP module on pp 16: the report's own split,
    # 3 + 4 x 14 + 2 (arXiv 2412.19437 §3.2; the output layer weighs 1.39 layers here, so the
    # short end takes it: loads 3, 4, 2 + 1.39)
    from autoparallel import load_model

    bare = load_model("deepseek-v3").model_copy(update={"mtp_layers": 0})
    ds = make_problem(bare, "h800", 2048, 4096, 15360)
    lay, note = with_default_split(ds, Layout(pp=16, ep=64))
    assert lay.stage_layers == [3] + [4] * 14 + [2] and "61 layers" in note
    t = enumerate_layouts(ds, SearchSpace(tp=[1], pp=[16], vp=[1], ep=[64], cp=[1]))
    assert {(int(f), int(last)) for f, last in zip(t["lf"], t["ll"])} == {(3, 2)}
    # with the MTP module on the last stage (one more block, a second head pass: 1 + 2 x 1.39
    # = 3.78 layers there) the last stage takes one layer: loads 4, 4, 1 + 3.78 = 4.78, where
    # 3 + 4 x 14 + 2 would load it with 5.78
    mtp = make_problem("deepseek-v3", "h800", 2048, 4096, 15360)
    lay, _ = with_default_split(mtp, Layout(pp=16, ep=64))
    assert lay.stage_layers == [4] * 15 + [1]
    # untouched: an even split, a split already given, pp = 1
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    for given in (Layout(tp=8, pp=2), Layout(tp=8, pp=16, stage_layers=[6] + [8] * 14 + [8]),
                  Layout(tp=8)):
        assert with_default_split(p, given) == (given, None)
    assert default_split(build_arch(p.model), 8192, 14, 1) is None  # 126 = 14 x 9, even
    # the Python API and a slug get it too
    rec = api.estimate(model="llama3-405b", gpu="h100", gpus=16384, seq_len=8192,
                       global_batch=2048, layout="dp128-tp8-pp16-vp8-cp1-ep1-z1-rfull-sp-mb1")
    assert rec["layout"]["stage_layers"] == [7] + [8] * 14 + [7]
    assert rec["layout"]["split"] == "balanced" and "16 x 8 = 128" in rec["notes"][0]
    assert "--account-for-embedding-in-pipeline-split" in api.export(
        "megatron", p, "dp128-tp8-pp16-vp8-cp1-ep1-z1-rfull-sp-mb1")


def test_uneven_slug_round_trip_and_sum():
    lay = Layout(dp=128, tp=8, pp=16, stage_layers=[7] + [8] * 14 + [7])
    assert lay.slug == "dp128-tp8-pp16[7,8x14,7]-vp1-cp1-ep1-z1-rnone-mb1"
    back = Layout.from_slug(lay.slug)
    assert back.slug == lay.slug and back.stage_layers == lay.stage_layers
    assert Layout.from_slug("dp8-tp1-pp2-vp1-cp1-ep1-z1-rnone-mb1-szbh1").schedule == "zb-h1"
    with pytest.raises(ValueError, match="middle stages"):
        Layout(pp=4, stage_layers=[7, 8, 9, 7])
    with pytest.raises(ValueError, match="pp = 3"):
        Layout(pp=3, stage_layers=[7, 8, 9, 7])
    assert Layout(pp=4, stage_layers=[8, 8, 8, 8]).stage_layers is None  # even = default


def test_enumerated_uneven_splits_sum_to_the_layers_and_pass_the_rule():
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    t = enumerate_layouts(p)
    uneven = np.flatnonzero(t["lf"] > 0)
    assert len(uneven) > 1000
    ev = evaluate(p, t.take(uneven[:: max(1, len(uneven) // 400)]))
    for i in range(len(ev)):
        rec = ev.record(i)
        sl = rec["layout"]["stage_layers"]
        if (ev.reject[i] & 4) == 0:  # passes the layers rule
            assert sum(sl) == 126 and len(sl) == rec["layout"]["pp"]
            assert all(x % rec["layout"]["vp"] == 0 for x in sl[1:-1]) and min(sl) >= 1


def test_uneven_split_pacing_and_memory_come_from_the_real_stages():
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    lay = Layout(tp=8, pp=16, stage_layers=[7] + [8] * 14 + [7])
    heavy_last = Layout(tp=8, pp=16, stage_layers=[8] + [8] * 14 + [6])
    r, h = estimate(p, lay), estimate(p, heavy_last)
    assert r["layout"]["stage_layers"] == [7] + [8] * 14 + [7]
    assert r["layout"]["grad_accum"] == 16
    # with 8 layers the first stage (embedding parameters in its optimizer step and gradient
    # reduction) paces the pipeline; with 7 an 8-layer middle stage does: Meta's split is faster
    assert r["time_s"]["step"] < h["time_s"]["step"]
    # the first stage holds 16 micro-batches of 7 instead of 8 layers
    assert r["memory_gib"]["activations"] < h["memory_gib"]["activations"]
    # most loaded: with 7 first-stage layers rank 1 (15 micro-batches x 8 layers = 120) beats
    # rank 0 (16 x 7 = 112); with 8 rank 0 holds 16 x 8 = 128
    assert h["memory_gib"]["activations"] / r["memory_gib"]["activations"] == pytest.approx(128 / 120, rel=1e-9)
    with pytest.raises(SpecError, match="stage_layers"):
        estimate(p, Layout(tp=8, pp=16, stage_layers=[7] + [8] * 14 + [8]))


# ---------------------------------------------------------------- schedules: closed forms

def _one_row(**kw):
    base = dict(dp=1, tp=1, cp=1, ep=1, zero=1, rc=0, sp=0, mb=1)
    return LayoutTable.from_arrays(**(base | kw))


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_schedule_bubbles_against_the_papers(p):
    F, B, W = 1.0, 2.0, 1.0  # B the full backward (DeepSeek-V3 Table 2 notation), W its weight part
    tau = F + B
    cases = {  # schedule code, vp: bubble
        (0, 1): (p - 1) * (F + B),  # 1F1B
        (1, 2): (p - 1) * (F + B) / 2,  # interleaved, v = 2
        (2, 1): (p - 1) * (F + B - 2 * W),  # ZB-H1 (ZB1P row of the table)
        (3, 2): (p - 1) / 2 * max(F, F + B - 3 * W),  # ZB-V: the V's warm-up, (p-1) F/2
        (4, 1): (p / 2 - 1) * ((F + B) + B - 3 * W),  # DualPipe, F&B = F + B
        (5, 2): (p - 1) / 2 * ((F + B) + B - 3 * W),  # DualPipeV
    }
    for (sch, vp), want in cases.items():
        t = _one_row(pp=p, vp=vp, sch=sch)
        got = pipeline_bubble(t, np.array([tau]), np.array([F]), np.array([W]))[0]
        assert got == pytest.approx(want, rel=1e-12), (sch, vp)
    # at the papers' equal-time point (F = B_input = W = 1) ZB-V keeps only the V's warm-up,
    # p - 1 chunk forwards of F/2, a third of interleaved v = 2's (p-1)/2 (F + B)
    t = _one_row(pp=p, vp=2, sch=3)
    assert pipeline_bubble(t, np.array([3.0]), np.array([1.0]), np.array([1.0]))[0] == (p - 1) / 2


@pytest.mark.parametrize("p,m", [(2, 8), (4, 8), (8, 32), (4, 3)])
def test_schedule_in_flight_counts_against_the_references(p, m):
    # reference §3.3: 1F1B min(m, p - r); ZB-H1 p (r W passes pending, Qi et al. 2023 Fig. 3);
    # ZB-V p; DualPipe p + 1 (DeepSeek-V3 Table 2); DualPipeV 2p + 1 half-stage chunks
    pp, m_ = np.array([float(p)]), np.array([float(m)])
    for r in range(p):
        for sch, vp, want in ((0, 1, min(m, p - r)), (2, 1, min(m, p)), (3, 2, min(m, p)),
                              (4, 1, min(m, p + 1)), (5, 2, min(m, p + 0.5))):
            got = _held(pp, np.array([float(vp)]), m_, r, np.array([sch]))[0]
            assert got == want, (sch, r)


# ---------------------------------------------------------------- schedules: simulation

def _simulate(p, m, f, b, w, limit):
    """Discrete-event list scheduling of one pipeline: p stages, m micro-batches, F/B/W ops
    (w = 0: B is the full backward). A stage that is free runs the first ready op in the order
    B, F, W; F only while fewer than limit[s] micro-batches are alive on it (F started, W (or B)
    not finished). Returns (idle seconds per stage, peak alive per stage)."""
    done: dict = {}
    free = [0.0] * p
    nxt = {"F": [0] * p, "B": [0] * p, "W": [0] * p}
    peak = [0] * p
    kinds = ("B", "F", "W") if w else ("B", "F")
    release = "W" if w else "B"
    dur = {"F": f, "B": b, "W": w}
    left = p * m * len(kinds)
    while left:
        s = min((k for k in range(p) if any(nxt[x][k] < m for x in kinds)), key=lambda k: free[k])
        T = free[s]
        alive = nxt["F"][s] - sum(1 for j in range(m) if done.get((release, s, j), np.inf) <= T)
        chosen = None
        for kind in kinds:
            j = nxt[kind][s]
            if j >= m or (kind == "F" and alive >= limit[s]):
                continue
            deps = {"F": [("F", s - 1, j)] if s else [],
                    "B": [("F", s, j)] + ([("B", s + 1, j)] if s < p - 1 else []),
                    "W": [("B", s, j)]}[kind]
            if all(done.get(d, np.inf) <= T for d in deps):
                chosen = kind, j
                break
        if chosen is None:  # wait for the next finish anywhere (or let a stage at T go first)
            later = [t for t in done.values() if t > T] + [x for x in free if x > T]
            free[s] = min(later) if later else T + 1e-12
            continue
        kind, j = chosen
        done[(kind, s, j)] = free[s] = T + dur[kind]
        nxt[kind][s] += 1
        left -= 1
        if kind == "F":
            peak[s] = max(peak[s], alive + 1)
    makespan = max(free)
    return [makespan - m * (f + b + w)] * p, peak


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (4, 4), (8, 16)])
def test_1f1b_simulation_matches_the_closed_forms(p, m):
    F, B = 1.0, 2.0
    idle, peak = _simulate(p, m, F, B, 0.0, [p - s for s in range(p)])
    t = _one_row(pp=p, vp=1, sch=0)
    assert idle[0] == pytest.approx(pipeline_bubble(t, np.array([F + B]), np.array([F]), np.array([0.0]))[0],
                                    abs=1e-9)
    want = [_held(np.array([float(p)]), np.array([1.0]), np.array([float(m)]), s)[0] for s in range(p)]
    assert peak == want


@pytest.mark.parametrize("p,m", [(2, 4), (3, 7), (4, 8), (8, 16)])
def test_split_backward_simulation_brackets_the_zb_h1_bubble(p, m):
    # A greedy list schedule with the backward split (B input 1, W 1) under 1F1B's memory limit
    # holds exactly 1F1B's micro-batches and idles less than 1F1B; Qi et al.'s hand-built ZB-H1
    # reaches the lower bound (p-1)(F + B - 2W) the cost model uses, which the greedy one cannot
    # beat: closed form <= simulated < 1F1B.
    F, Bin, W = 1.0, 1.0, 1.0
    idle, peak = _simulate(p, m, F, Bin, W, [p - s for s in range(p)])
    assert peak == [min(m, p - s) for s in range(p)]
    zb = pipeline_bubble(_one_row(pp=p, vp=1, sch=2), np.array([F + Bin + W]), np.array([F]), np.array([W]))[0]
    one = (p - 1) * (F + Bin + W)
    assert zb == (p - 1) * (F + Bin - W)
    assert zb <= idle[0] + 1e-9 and idle[0] < one


# ---------------------------------------------------------------- schedules: fixed-order replay

def _replay(orders, deps, dur):
    """Discrete-event replay of fixed per-rank op orders. An op is a tuple of passes
    (kind, chunk, micro-batch) run back to back (an overlapped F&B pair is one op of both);
    it starts once its rank is free and every pass it depends on has finished (no
    communication time). Returns (start, finish, busy seconds per rank, makespan)."""
    start, done = {}, {}
    pos, free, busy = [0] * len(orders), [0.0] * len(orders), [0.0] * len(orders)
    left = sum(map(len, orders))
    while left:
        moved = False
        for r, order in enumerate(orders):
            while pos[r] < len(order):
                op = order[pos[r]]
                need = [d for key in op for d in deps(key) if d not in op]
                if not all(d in done for d in need):
                    break
                t = max([free[r]] + [done[d] for d in need])
                for key in op:
                    start[key], t = t, t + dur[key[0]]
                    done[key] = t
                    busy[r] += dur[key[0]]
                free[r], pos[r], left, moved = t, pos[r] + 1, left - 1, True
        assert moved, "the order deadlocks"
    return start, done, busy, max(free)


def _peak(orders, start, done, release):
    """Peak chunk-micro-batches per rank alive from their F's start to the end of `release`."""
    out = []
    for order in orders:
        ev = sorted((t, d) for op in order for key in op if key[0] == "F"
                    for t, d in ((start[key], 1), (done[release(key)], -1)))
        cur = peak = 0
        for _, d in ev:
            cur += d
            peak = max(peak, cur)
        out.append(peak)
    return out


def _chain_deps(n_chunks):
    """Dependencies along a path of chunks (k = 0 .. n-1, chunk keys (path, k)): F after the
    previous chunk's F, the input-gradient pass B after the next chunk's B (the last chunk's
    after its own F), the weight pass W (or Wf, the W of a full backward) after its B."""
    def deps(key):
        kind, (path, k), j = key
        if kind == "F":
            return [("F", (path, k - 1), j)] if k else []
        if kind == "B":
            return [("B", (path, k + 1), j)] if k < n_chunks - 1 else [("F", (path, k), j)]
        return [("B", (path, k), j)]
    return deps


def _zb_h1_orders(p, m):
    """ZB-H1 (Qi et al. 2023 §3.1, Fig. 3): 1F1B's order with the backward split in B and W;
    stage s runs p - s - 1 warm-up forwards, then s (F, B) pairs whose W it postpones to the
    very end, then (F, B, W) rounds and the cool-down (B, W), then the s postponed W."""
    orders = []
    for s in range(p):
        c, ops, f, b, late = (0, s), [], 0, 0, []
        for _ in range(min(p - s - 1, m)):
            ops, f = ops + [(("F", c, f),)], f + 1
        for _ in range(s):
            if f < m:
                ops += [(("F", c, f),), (("B", c, b),)]
                late.append((("W", c, b),))
                f, b = f + 1, b + 1
        while b < m:
            if f < m:
                ops, f = ops + [(("F", c, f),)], f + 1
            ops, b = ops + [(("B", c, b),), (("W", c, b),)], b + 1
        orders.append(ops + late)
    return orders


def _dualpipe_orders(p, m, v):
    """Per-rank op order of deepseek-ai/DualPipe's `step` (dualpipe.py, v = False: p ranks,
    m/2 micro-batches each way; dualpipev.py, v = True: one V of 2p chunks), its eight phases
    with their counts: nF0, nF0F1, nB1W1F1 (zero-bubble B), the main nF0B1F1B0 of overlapped
    F&B pairs (the middle / last rank runs its first pair apart), nB1F1B0, nB1B0 (zero-bubble
    from the middle on), nWB0, nW; W passes run first in, first out."""
    orders = []
    for r in range(p):
        if v:
            half, n_half, per_dir, apart = r, p, m, r == p - 1
            chunk = {0: (0, r), 1: (0, 2 * p - 1 - r)}
        else:
            half, n_half, per_dir = min(r, p - 1 - r), p // 2, m // 2
            apart = r in (p // 2 - 1, p // 2)
            d = int(r >= p // 2)  # phase 0 runs the forward direction on the first half
            chunk = {0: (d, r if d == 0 else p - 1 - r), 1: (1 - d, r if d == 1 else p - 1 - r)}
        nf, nb, pending, ops = {0: 0, 1: 0}, {0: 0, 1: 0}, [], []

        def F(ph):
            nf[ph] += 1
            return ("F", chunk[ph], nf[ph] - 1)

        def B(ph, zb=False):
            nb[ph] += 1
            key = ("B", chunk[ph], nb[ph] - 1)
            if zb:
                pending.append(("W", chunk[ph], nb[ph] - 1))
                return (key,)
            return key, ("Wf", chunk[ph], nb[ph] - 1)

        def W():
            return (pending.pop(0),)

        ops += [(F(0),) for _ in range(2 * (n_half - half - 1))]
        for _ in range(half + 1):
            ops += [(F(0),), (F(1),)]
        for _ in range(n_half - half - 1):
            ops += [B(1, True), W(), (F(1),)]
        for i in range(per_dir - 2 * n_half + half + 1):
            ops += [(F(0),), B(1)] if i == 0 and apart else [(F(0), *B(1))]
            ops.append((F(1), *B(0)))
        for _ in range(n_half - half - 1):
            ops += [B(1), (F(1), *B(0))]
        zb = False
        for i in range(half + 1):
            zb = zb or (i == (half + 1) // 2 and half % 2 == 1)
            ops.append(B(1, zb))
            zb = zb or (i == (half + 1) // 2 and half % 2 == 0)
            ops.append(B(0, zb))
        for _ in range(n_half - half - 1):
            ops += [W(), B(0, True)]
        ops += [W() for _ in range(half + 1)]
        assert not pending and nf == nb == {0: per_dir, 1: per_dir}
        orders.append(ops)
    return orders


TIMES = [(1.0, 1.0, 1.0), (1.0, 1.5, 0.5), (1.0, 2.0, 1.0), (2.0, 1.0, 1.0), (1.2, 1.4, 0.8)]
"""Chunk pass times (F, B input, W) the replays run: the papers' equal point, GEMM-heavy and
attention-heavy backwards, and F = B (full backward = forward)."""


@pytest.mark.parametrize("p,m", [(2, 2), (3, 7), (4, 4), (4, 9), (8, 8), (8, 32)])
def test_zb_h1_in_qi_order_idles_exactly_the_closed_form(p, m):
    for f, b, w in TIMES:
        orders = _zb_h1_orders(p, m)
        start, done, busy, span = _replay(orders, _chain_deps(p), {"F": f, "B": b, "W": w})
        assert busy == [pytest.approx(m * (f + b + w))] * p
        t = _one_row(pp=p, vp=1, sch=2)
        want = pipeline_bubble(t, np.array([f + b + w]), np.array([f]), np.array([w]))[0]
        assert span - busy[0] == pytest.approx(want, abs=1e-9), (f, b, w)
        # held until W: p on every stage (the ledger's count); until B: 1F1B's p - s
        held = [_held(np.array([float(p)]), np.array([1.0]), np.array([float(m)]), s,
                      np.array([2]))[0] for s in range(p)]
        assert _peak(orders, start, done, lambda k: ("W", *k[1:])) == held
        until_b = _peak(orders, start, done, lambda k: ("B", *k[1:]))
        assert until_b == [min(m, p - s) for s in range(p)]


@pytest.mark.parametrize("v,p,m", [(False, 2, 4), (False, 4, 8), (False, 4, 18), (False, 6, 12),
                                   (False, 8, 16), (False, 8, 40), (True, 2, 4), (True, 3, 7),
                                   (True, 4, 8), (True, 4, 13), (True, 8, 16)])
def test_dualpipe_and_dualpipev_in_the_repository_order(v, p, m):
    # The DualPipe README's bubble (PP/2 - 1)(F&B + B - 3W), F&B = F + B, bounds the replay
    # from above, tightly when F = B; in-flight chunk-micro-batches are PP + 1 on every rank.
    n = 2 * p if v else p
    chunks = 2 if v else 1  # rank-level passes are `chunks` chunk passes
    for f, b, w in TIMES:
        orders = _dualpipe_orders(p, m, v)
        dur = {"F": f, "B": b, "W": w, "Wf": w}
        start, done, busy, span = _replay(orders, _chain_deps(n), dur)
        assert busy == [pytest.approx(m * chunks * (f + b + w))] * p
        t = _one_row(pp=p, vp=chunks, sch=5 if v else 4)
        bound = pipeline_bubble(t, np.array([chunks * (f + b + w)]), np.array([chunks * f]),
                                np.array([chunks * w]))[0]
        assert bound == pytest.approx((n / 2 - 1) * ((f + b + w) + (b + w) - 3 * w))
        idle = span - busy[0]
        if f == b + w:
            assert idle == pytest.approx(bound, abs=1e-9), (f, b, w)
        else:
            assert 0.0 <= idle <= bound + 1e-9, (f, b, w)
        peak = _peak(orders, start, done,
                     lambda k: ("Wf", *k[1:]) if ("Wf", *k[1:]) in done else ("W", *k[1:]))
        assert peak == [n + 1] * p
        held = _held(np.array([float(p)]), np.array([float(chunks)]), np.array([float(m)]), 0,
                     np.array([5 if v else 4]))[0]
        assert held == (n + 1) / chunks


def _greedy_v(p, m, f, b, w):
    """A greedy list schedule of the ZB-V shape (Qi et al. 2024: 2p chunks, rank r holding
    chunks r and 2p-1-r) under 1F1B's memory, 2p chunk-micro-batches alive until their W, at
    most p of them on the first chunk: a free rank runs a ready B (later chunk first), else an
    F (later chunk first), else a W. Returns (idle seconds, peak alive per rank)."""
    C = 2 * p
    mine = [[r, C - 1 - r] for r in range(p)]
    deps = _chain_deps(C)
    done, free, alive, peak = {}, [0.0] * p, [[] for _ in range(p)], [0] * p
    nxt = {(kind, k): 0 for kind in "FBW" for k in range(C)}
    dur = {"F": f, "B": b, "W": w}
    left = 3 * C * m
    while left:
        r = min(range(p), key=lambda x: free[x])
        T = free[r]
        live = [key for key in alive[r] if not (key in done and done[key] <= T)]
        pick = None
        for kind in "BFW":
            for k in (sorted(mine[r]) if kind == "W" else sorted(mine[r], reverse=True)):
                j = nxt[(kind, k)]
                key = (kind, (0, k), j)
                if j >= m or (kind == "F" and (len(live) >= C or (
                        k < p and sum(1 for x in live if x[1][1] == k) >= p))):
                    continue
                if all(d in done and done[d] <= T for d in deps(key)):
                    pick = key
                    break
            if pick:
                break
        if pick is None:  # wait for the next finish anywhere (or let a rank at T go first)
            later = [t for t in done.values() if t > T] + [x for x in free if x > T]
            free[r] = min(later) if later else T + 1e-9
            continue
        done[pick] = free[r] = T + dur[pick[0]]
        nxt[(pick[0], pick[1][1])] += 1
        left -= 1
        if pick[0] == "F":
            alive[r].append(("W", *pick[1:]))
            peak[r] = max(peak[r], len(live) + 1)
    return max(free) - m * 2 * (f + b + w), peak


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 32)])
def test_zbv_closed_form_bounds_a_v_schedule_from_below(p, m):
    # The bottom of the V waits p - 1 chunk forwards before its first pass, so no ZB-V order
    # idles less than (p - 1) F/2 (rank-level F); the closed form adds the B/W imbalance. A
    # greedy V under 1F1B's memory never beats it and meets it at the papers' equal point.
    for f, b, w in TIMES:
        idle, peak = _greedy_v(p, m, f, b, w)
        t = _one_row(pp=p, vp=2, sch=3)
        form = pipeline_bubble(t, np.array([2 * (f + b + w)]), np.array([2 * f]),
                               np.array([2 * w]))[0]
        assert form >= (p - 1) * f - 1e-12
        assert form <= idle + 1e-6, (f, b, w)
        held = _held(np.array([float(p)]), np.array([2.0]), np.array([float(m)]), 0, np.array([3]))
        assert max(peak) / 2 <= held[0]
    if m == 4 * p:
        idle, _ = _greedy_v(p, m, 1.0, 1.0, 1.0)
        assert idle == pytest.approx((p - 1) * 1.0, abs=1e-6)


# ---------------------------------------------------------------- search, exports

def test_schedules_as_a_search_axis():
    p = make_problem("llama3-70b", "h100", 256, 8192, 512)
    every = [s.value for s in Schedule]
    t = enumerate_layouts(p, SearchSpace(tp=[8], pp=[4], cp=[1], zero=[1], recompute=["none"],
                                         sp=[True], micro_batch=[1], schedule=every))
    # by default only the schedules the job's stack implements (megatron-core: 1F1B, interleaved)
    default = enumerate_layouts(p, SearchSpace(tp=[8], pp=[4], cp=[1], zero=[1],
                                               recompute=["none"], sp=[True], micro_batch=[1]))
    assert set(default["sch"].tolist()) == {0, 1}
    # 80 layers on pp 4: 1F1B is pruned behind ZB-H1 (same memory, smaller bubble), interleaved
    # vp 2 behind ZB-V, DualPipeV behind ZB-V (dense model)
    got = {(int(t["vp"][i]), int(t["sch"][i])) for i in range(len(t))}
    assert (1, 2) in got and (1, 4) in got and (2, 3) in got and (4, 1) in got
    assert (1, 0) not in got and (2, 1) not in got and (2, 5) not in got
    only = enumerate_layouts(p, SearchSpace(tp=[8], pp=[4], cp=[1], zero=[1], recompute=["none"],
                                            sp=[True], micro_batch=[1], schedule=["1f1b"]))
    assert set(only["sch"].tolist()) == {0} and set(only["vp"].tolist()) == {1}


def test_megatron_export_writes_uneven_stage_flags_and_refuses_dualpipe():
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    text = render("megatron", p, Layout(tp=8, pp=16, stage_layers=[7] + [8] * 14 + [7]))
    assert "--decoder-first-pipeline-num-layers 7 --decoder-last-pipeline-num-layers 7" in text
    with pytest.raises(ExportError) as err:
        render("megatron", p, Layout(tp=8, pp=16, schedule="dualpipe",
                                     stage_layers=[7] + [8] * 14 + [7]))
    assert "schedule `dualpipe`" in str(err.value)



def test_torchtitan_export_writes_the_uneven_splits_its_own_split_reproduces():
    """TorchTitan (v0.2.2 `generate_llm_fqn_per_model_part`, 0.3.0 `_generate_llm_fqn_per_model_
    part`) deals L + first_less + last_less effective layers out evenly over the virtual stages
    and drops the weights from the first and last: 126 + 1 + 1 = 128 over 16 stages = 8 each,
    first and last 7, i.e. the Llama 3 paper's [7, 8x14, 7] (arXiv 2407.21783 §3.3.2)."""
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    lay = Layout(tp=8, pp=16, stage_layers=[7] + [8] * 14 + [7])
    for version in ("0.3", "0.2.2"):
        text = render("torchtitan", p, lay, version)
        sep = "=" if version == "0.3" else " = "
        for key, value in (("layers_per_stage", 8), ("first_stage_less_layers", 1),
                           ("last_stage_less_layers", 1)):
            assert f"pipeline_parallel_{key}{sep}{value}" in text, (version, key)
    # 61 layers (DeepSeek-V3) on pp 4 as [15, 16, 16, 14]: E = 61 + 1 + 2 = 64, 16 per stage
    ds = make_problem("deepseek-v3", "h100", 256, 4096, 1024)
    # (TorchTitan 0.3 borrows EP from dp_shard x cp x tp without expert TP: etp = 1)
    text = render("torchtitan", ds, Layout(tp=8, pp=4, ep=8, etp=1, stage_layers=[15, 16, 16, 14]))
    assert "pipeline_parallel_first_stage_less_layers=1" in text
    assert "pipeline_parallel_last_stage_less_layers=2" in text
    # the rest is refused with the reason and the targets that can: a first stage heavier than
    # the middle ones (TorchTitan's weights only take layers away), and any uneven split with
    # vp > 1 (TorchTitan shortens only its first virtual stage, not every chunk of rank 0)
    for bad, why in ((Layout(tp=8, pp=16, stage_layers=[9] + [8] * 14 + [5]), "deals the layers"),
                     (Layout(tp=8, pp=8, vp=2, stage_layers=[14] + [16] * 7),
                      "model chunks hold [7,8x7,7,8x7]")):
        with pytest.raises(ExportError) as err:
            render("torchtitan", p, bad)
        assert "uneven pipeline split" in str(err.value) and why in str(err.value)
        assert str(err.value).splitlines()[-1] == ("targets that can launch it: megatron, slurm, "
                                                   "megatron-bridge")
    with pytest.raises(ExportError, match="TorchTitan 0.1 has no first/last-stage"):
        render("torchtitan", p, lay, "0.1")


# ---------------------------------------------------------------- published layouts

def test_llama_405b_published_layout_is_accepted_and_ranked():
    # Llama 3 paper (arXiv 2407.21783 Table 4): 16,384 H100, seq 8192, 16M-token batches
    # (2048 sequences), TP8 CP1 PP16 DP128, first and last stage one layer short
    p = make_problem("llama3-405b", "h100", 16384, 8192, 2048)
    # (gradients and optimizer sharded, parameters kept: FSDP as ZeRO-2, paper §3.3.2)
    meta = Layout(tp=8, pp=16, dp=128, zero=2, stage_layers=[7] + [8] * 14 + [7])
    res = plan(p, top=5)
    assert any(int(res.survivors.table["pp"][i]) == 16 for i in range(len(res.survivors)))
    st = res.standing(meta)
    assert st["estimate"]["fits"] and st["rank"] is not None and 1 <= st["rank"] <= st["n_fit"]
    assert st["gap"] >= 0.0


def test_deepseek_v3_published_layout_is_accepted_and_ranked():
    # DeepSeek-V3 report (arXiv 2412.19437 §3.2): 2,048 H800, PP16 DualPipe, EP64, ZeRO-1, no TP;
    # seq 4096, batch 15360 sequences at full ramp. 61 layers: 4 per middle stage, 3 + 2 at the ends
    p = make_problem("deepseek-v3", "h800", 2048, 4096, 15360)
    # DeepSeek recomputes RMSNorm and the MLA up-projections and caches FP8 activations (§3.3);
    # the cost model has neither, full recompute is its nearest layout that fits
    ds = Layout(tp=1, pp=16, ep=64, zero=1, recompute="full", schedule="dualpipe",
                stage_layers=[3] + [4] * 14 + [2])
    rec = estimate(p, ds)
    assert rec["layout"]["schedule"] == "dualpipe" and rec["layout"]["stage_layers"][0] == 3
    res = plan(p, SearchSpace(tp=[1], pp=[16], ep=[64]), top=5)
    st = res.standing(ds)
    assert st["estimate"]["fits"] and st["rank"] is not None and st["rank"] <= st["n_fit"]


def test_bloom_published_layout_is_accepted_ranked_and_exported():
    # BLOOM tr11-176B-ml README: 384 A100 80GB, TP4 PP12 DP8, 70 layers, mbs 2, gbs 2048,
    # seq 2048, ZeRO-1, full recompute; 70 = 5 + 10 x 6 + 5
    p = make_problem(BLOOM, "a100-80gb", 384, 2048, 2048)
    bloom = Layout(tp=4, pp=12, dp=8, zero=1, recompute="full", micro_batch=2,
                   stage_layers=[5] + [6] * 10 + [5])
    res = plan(p, top=5)
    st = res.standing(bloom)
    assert st["estimate"]["fits"] and st["rank"] is not None and st["rank"] <= st["n_fit"]
    text = render("megatron", p, bloom)
    assert "--decoder-first-pipeline-num-layers 5 --decoder-last-pipeline-num-layers 5" in text
