"""The MoE job settings the cost model assumed reach the Megatron-LM script (dispatcher,
all-to-all overlap, routing, CUDA graphs), read back by Megatron-LM's parser (the
tests/launcher_checks.py mirror of arguments.py, with TransformerConfig's own checks), and what
Megatron-Core refuses is refused with the reason."""

from __future__ import annotations

import pytest

from autoparallel import Layout, make_problem
from autoparallel.errors import ExportError
from autoparallel.exporters import render
from launcher_checks import megatron_script_layout

LAY = Layout(tp=1, ep=8, zero=1)


def _args(**job):
    p = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, **job)
    text = render("megatron", p, LAY)
    return text, megatron_script_layout(text)["args"]


@pytest.mark.parametrize("dispatcher, kind, backend", [
    ("alltoall", "alltoall", None), ("allgather", "allgather", None),
    ("deepep", "flex", "deepep"), ("hybridep", "flex", "hybridep")])
def test_the_dispatcher_as_megatron_names_it(dispatcher, kind, backend):
    text, g = _args(moe_dispatcher=dispatcher)
    assert g.moe_token_dispatcher_type == kind
    if backend:
        assert g.moe_flex_dispatcher_backend == backend
    else:
        assert "--moe-flex-dispatcher-backend" not in text


def test_overlap_routing_and_graphs():
    text, g = _args(moe_a2a_overlap=True, moe_routing="balanced", cuda_graphs="scoped")
    assert g.overlap_moe_expert_parallel_comm and g.delay_wgrad_compute
    assert g.moe_router_force_load_balancing
    assert g.cuda_graph_impl == "transformer_engine"
    assert g.cuda_graph_scope == ["attn", "moe_router", "moe_preprocess"]
    text, g = _args(moe_routing="capacity", moe_capacity_factor=1.25, moe_dispatcher="hybridep",
                    cuda_graphs="full")
    assert g.moe_expert_capacity_factor == 1.25 and g.moe_pad_expert_input_to_capacity
    assert not g.moe_router_force_load_balancing
    assert (g.cuda_graph_impl, g.cuda_graph_scope) == ("local", ["full_iteration"])
    # dropless, the megatron-core default: no routing flag, no graphs
    text, g = _args()
    assert not (g.moe_router_force_load_balancing or g.moe_pad_expert_input_to_capacity)
    assert g.cuda_graph_impl == "none" and "--overlap-moe" not in text


def test_megatron_bridge_plans_export_their_forced_balance():
    """A megatron-bridge plan assumed forced-balanced routing (its performance scripts' setting):
    the script says so instead of silently training dropless."""
    p = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, stack="megatron-bridge")
    assert p.training.moe_routing == "balanced"
    assert megatron_script_layout(render("megatron", p, LAY))["args"].moe_router_force_load_balancing


def test_deepep_with_padded_capacity_is_refused():
    p = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, moe_dispatcher="deepep",
                     moe_routing="capacity")
    with pytest.raises(ExportError, match="does not support moe_pad_expert_input_to_capacity"):
        render("megatron", p, LAY)


def test_dense_models_write_no_moe_flags_but_their_graphs():
    p = make_problem("llama3-8b", "h100", 8, 4096, 64, cuda_graphs="scoped")
    text = render("megatron", p, Layout(tp=1, zero=1))
    assert "--moe-" not in text
    g = megatron_script_layout(text)["args"]
    assert (g.cuda_graph_impl, g.cuda_graph_scope) == ("transformer_engine", ["attn"])


def test_torchtitan_writes_forced_balance_and_refuses_what_it_cannot_express():
    def p(**job):
        return make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, stack="torchtitan", **job)

    lay = Layout(tp=1, ep=8, zero=3)
    assert "config.debug.moe_force_load_balance = True" in render("torchtitan", p(
        moe_routing="balanced"), lay)
    assert "moe_force_load_balance" not in render("torchtitan", p(), lay)  # dropless
    with pytest.raises(ExportError, match="the deepep dispatcher"):
        render("torchtitan", p(moe_dispatcher="deepep"), lay)
    with pytest.raises(ExportError, match="TorchTitan's MoE is dropless"):
        render("torchtitan", p(moe_routing="capacity"), lay)
    with pytest.raises(ExportError, match="all-to-all overlap"):
        render("torchtitan", p(moe_a2a_overlap=True), lay)
    # 0.3 captures CUDA graphs by default and refuses them with the standard dispatcher: the
    # plan's "none" is written, its "scoped" refused (trainer.py validation)
    assert "config.training.disable_cuda_graphs = True" in render("torchtitan", p(), lay)
    graphs = make_problem("qwen3-30b-a3b", "h100", 8, 4096, 64, cuda_graphs="scoped")
    with pytest.raises(ExportError, match="without CPU synchronization"):
        render("torchtitan", graphs, lay)  # (the torchtitan stack itself runs no graphs)
    from autoparallel.exporters.torchtitan import TorchTitanExporter

    old = TorchTitanExporter("0.2.2")
    assert any("forced-balanced routing" in r for r in old.check(p(moe_routing="balanced"), lay))
