"""Hybrid models: the cost of a model given as a pattern of layer types (`ModelSpec.layers`).

A hybrid model's layers are single pre-norm residual blocks (Megatron-Core `MambaStack` /
`HybridStack`: each pattern letter builds one `MambaLayer`, `TransformerLayer` with attention
only, `MLPLayer` or MoE layer). Each type is priced by the terms that already price it:

- `*` attention, `-` MLP and `E` MoE by the transformer ledger (`cost.time.stage_times`,
  `cost.memory.layer_activation_bytes`, `stage_params`), run on a *variant* `Arch` that keeps
  only that block (the other block's weights and activations zero, one norm of h weights, one TP
  collective pair: `Arch.blocks = 1`); a LatentMoE `E` (Nemotron-3 Super, `--moe-latent-size`)
  is the routed experts on the latent width, plus the h -> latent -> h projections and the
  shared experts as two-matrix MLPs of widths latent and shared on h;
- `M` Mamba-2 and `G` gated DeltaNet by `cost.ssm_mixer` (`cost.mamba`, `cost.linear_attention`).

A stage's cost is the sum over types of (layers of that type on the stage) x (one layer's cost);
the embedding, output layer and loss are counted once. Which layers a stage holds comes from the
pattern: Megatron-Core's even split gives rank r the chunks j p + r (j < v) of L / (p v)
consecutive layers; an uneven split the first `lf`, the middle share and the last `ll` layers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from ..layouts import LayoutTable
from ..specs.layer_pattern import ATTENTION, GDN, LETTERS, MAMBA, MLP, MOE
from ..specs.model import ModelSpec
from ..specs.problem import Problem
from .arch import Arch, transformer_arch
from .comm import Collective, collective_time
from .linear_attention import build_gated_deltanet
from .mamba import build_mamba
from .memory import layer_activation_bytes, stage_params
from .overlap import hidden_cost
from .stages import stage_layer_counts, stages
from .time import stage_times, tp_pair
from .ssm_mixer import mixer_activation_bytes, mixer_cp_bytes, mixer_forward


@dataclass(frozen=True)
class Part:
    """One transformer-ledger component of a layer type: a variant `Arch` keeping one block."""

    letter: str
    arch: Arch
    moe: bool
    attention: bool


@dataclass(frozen=True, eq=False)
class HybridArch:
    """The layer types of a hybrid model and its totals (counts, per token)."""

    letters: str
    parts: tuple[Part, ...]
    """Transformer-ledger parts; parts[0] is the attention part, which carries the embedding,
    the output layer and the loss."""
    mixers: dict
    """Pattern letter -> `MixerArch` for the recurrent mixers present."""
    hidden: int
    vocab: int
    p_embed: float
    p_output: float
    p_final_norm: float
    attn_score_width: float
    n_mtp: int = 0
    """Multi-token-prediction modules (`ModelSpec.mtp_layers`), each an attention layer and a
    feed-forward layer (`mtp_letters`) on the last stage, a 2h -> h projection and one more pass
    through the output head (Megatron-Core `MultiTokenPredictionBlock` on the hybrid stack:
    Nemotron-3's `mtp_hybrid_override_pattern` "*E")."""

    @property
    def mtp_letters(self) -> str:
        """The layer types of one MTP module: attention and the model's feed-forward kind (MoE
        where the pattern has MoE layers, else MLP)."""
        return ATTENTION + (MOE if MOE in self.letters else MLP)

    @cached_property
    def cum(self) -> dict[str, np.ndarray]:
        """Per letter, the cumulative count of its layers before each position (length L + 1)."""
        out = {}
        for k in LETTERS:
            hits = np.frombuffer(self.letters.encode(), dtype=np.uint8) == ord(k)
            out[k] = np.concatenate([[0], np.cumsum(hits)]).astype(np.float64)
        return out

    def count(self, letter: str) -> int:
        return self.letters.count(letter)

    # The cost model's entry points for a hybrid model (`Arch.hybrid` is not None): the stage,
    # memory and time modules call these instead of their transformer branch.
    def stages(self, arch: Arch, t: LayoutTable, global_batch: int) -> dict:
        """`cost.stages.stages` with per-type layer counts (`hybrid_stages`)."""
        return hybrid_stages(arch, t, global_batch)

    def stage_times(self, problem: Problem, arch: Arch, t: LayoutTable, groups) -> dict[str, dict]:
        """`cost.time.stage_times` summed over the layer types (`hybrid_stage_times`)."""
        return hybrid_stage_times(problem, arch, t, groups)

    def stage_params(self, arch: Arch, t: LayoutTable, st) -> tuple[np.ndarray, np.ndarray]:
        """`cost.memory.stage_params` summed over the layer types (`hybrid_stage_params`)."""
        return hybrid_stage_params(arch, t, st)

    def activations(self, problem: Problem, arch: Arch, t: LayoutTable, st):
        """A stage's activations and recompute working set (`hybrid_activations`)."""
        return hybrid_activations(problem, arch, t, st)

    @property
    def n_params(self) -> float:
        layers = sum(p.arch.n_dense_layers * p.arch.dense_layer_params
                     + p.arch.n_moe_layers * p.arch.moe_layer_params for p in self.parts)
        mixers = sum(self.count(k) * mx.params for k, mx in self.mixers.items())
        return layers + mixers + self.p_embed + self.p_output + self.p_final_norm

    @property
    def n_params_active(self) -> float:
        inactive = sum(p.arch.n_moe_layers * p.arch.p_routed * (1 - p.arch.top_k / p.arch.n_experts)
                       for p in self.parts if p.moe)
        return self.n_params - inactive

    @property
    def gemm_params_per_token(self) -> float:
        """Weights each token multiplies through in the layers (routed experts: top-k only)."""
        return (sum(p.arch.gemm_params_per_token() for p in self.parts)
                + sum(self.count(k) * mx.gemm_params for k, mx in self.mixers.items()))

    def scan_flops_per_token(self) -> float:
        """Forward scan FLOPs per token over all mixer layers."""
        return sum(self.count(k) * mx.scan_flops for k, mx in self.mixers.items())

    def model_flops_per_sequence(self, seq_len: int) -> float:
        """Training FLOPs (3x forward) of one sequence: 6 s (GEMM weights + h V), the causal
        attention term 3 s^2 n_h (d_qk + d_v) per attention layer (reference §2.1), and three
        times each mixer's scan FLOPs (SSD / chunkwise delta rule, `cost.mamba`,
        `cost.linear_attention`)."""
        s = float(seq_len)
        gemm = 6.0 * s * (self.gemm_params_per_token + self.hidden * self.vocab)
        attn = 3.0 * s * s * self.count(ATTENTION) * self.attn_score_width
        mtp = 0.0
        if self.n_mtp:  # as `Arch._mtp_gemm_params_per_token`: block, projection, logits
            block = sum(self.layer_gemm_params(k) for k in self.mtp_letters)
            mtp = self.n_mtp * (6.0 * s * (block + 2.0 * self.hidden ** 2 + self.hidden * self.vocab)
                                + 3.0 * s * s * self.attn_score_width)
        return gemm + attn + 3.0 * s * self.scan_flops_per_token() + mtp

    def layer_gemm_params(self, letter: str) -> float:
        """GEMM weights one token multiplies through in one layer of a transformer type."""
        total = 0.0
        for p in self.parts:
            if p.letter == letter:
                n = p.arch.n_dense_layers + p.arch.n_moe_layers
                total += p.arch.gemm_params_per_token() / max(n, 1)
        return total

    def layer_flops(self, letter: str, seq_len: int) -> float:
        """Forward FLOPs per token of one layer of a type (the split weights, `splits`)."""
        if letter in self.mixers:
            return self.mixers[letter].flops_per_token()
        total = 0.0
        for p in self.parts:
            if p.letter != letter:
                continue
            a = p.arch
            n = a.n_dense_layers + a.n_moe_layers
            total += 2.0 * a.gemm_params_per_token() / max(n, 1)
            if p.attention:
                total += seq_len * a.attn_score_width
        return total


def _zero_attention(a: Arch) -> Arch:
    """`a` without its attention block (its weights, activations and score FLOPs)."""
    return replace(a, p_attn_q=0.0, p_attn_kv=0.0, p_attn_rep=0.0, p_attn_out=0.0,
                   act_attn_rep=0.0, act_attn_qo=0.0, act_attn_kv=0.0, n_heads=0,
                   qk_head_dim=0, v_head_dim=0)


def _zero_mlp(a: Arch) -> Arch:
    """`a` without its dense MLP block."""
    return replace(a, p_mlp=0.0, act_mlp_rep=0.0, act_mlp_shard=0.0, ffn=0)


def build_hybrid_arch(model: ModelSpec) -> Arch:
    """The `Arch` of a hybrid model: the attention part's fields (which the rules and the
    output layer read) with `hybrid` holding every layer type (`HybridArch`)."""
    letters = model.layer_letters
    L = len(letters)
    h = model.hidden_size
    plain = model.model_copy(update={"layers": None, "moe": None, "mamba": None,
                                     "linear_attention": None})
    base = transformer_arch(plain)
    single = dict(blocks=1.0, p_norm=float(h), n_layers=L, n_moe_layers=0)
    n_attn, n_mlp, n_moe = (letters.count(k) for k in (ATTENTION, MLP, MOE))
    attn = replace(_zero_mlp(base), n_dense_layers=n_attn, **single)
    parts = [Part(ATTENTION, attn, False, True)]
    if n_mlp:
        parts.append(Part(MLP, replace(_zero_attention(base), n_dense_layers=n_mlp, **single),
                          False, False))
    if n_moe:
        moe = model.moe
        latent = moe.latent_size
        routed_model = plain.model_copy(update={
            "moe": moe.model_copy(update={"n_dense_layers": 0} | (
                {"n_shared_experts": 0, "shared_expert_ffn_hidden_size": None} if latent else {})),
            "hidden_size": latent or h})
        routed = _zero_attention(transformer_arch(routed_model))
        routed = replace(routed, n_dense_layers=0, blocks=1.0, n_layers=L, n_moe_layers=n_moe,
                         p_norm=float(h))
        parts.append(Part(MOE, routed, True, False))
        if latent:
            mlp = replace(_zero_attention(base), blocks=1.0, n_layers=L, n_moe_layers=0,
                          n_dense_layers=n_moe, p_norm=0.0)
            two = 2  # h -> latent and latent -> h: two plain matrices (no gate)
            # the projections are `parallel_mode="duplicated"` TELinears on the rank's own
            # (sequence-parallel) tokens (Megatron-Core moe_layer.py `fc1_latent_proj`,
            # `fc2_latent_proj`): no TP collective of their own (blocks = 0), the same FLOPs
            parts.append(Part(MOE, replace(mlp, ffn=latent, p_mlp=float(two * h * latent),
                                           act_mlp_shard=float(base.act_coef * latent),
                                           mlp_up=1, blocks=0.0), False, False))
            if moe.n_shared_experts:
                f_sh = moe.shared_ffn_total
                mu = base.mlp_up + 1
                # shares the layer's norm and input with the projection: no second LN input
                parts.append(Part(MOE, replace(mlp, ffn=f_sh, p_mlp=float(mu * h * f_sh),
                                               act_mlp_rep=0.0,
                                               act_mlp_shard=float(base.act_coef * f_sh)),
                                  False, False))
    mixers = {}
    if MAMBA in letters:
        mixers[MAMBA] = build_mamba(model.mamba, h)
    if GDN in letters:
        mixers[GDN] = build_gated_deltanet(model.linear_attention, h)
    hy = HybridArch(letters=letters, parts=tuple(parts), mixers=mixers, hidden=h,
                    vocab=model.vocab_size, p_embed=base.p_embed, p_output=base.p_output,
                    p_final_norm=base.p_final_norm, attn_score_width=base.attn_score_width,
                    n_mtp=model.mtp_layers)
    top = next((p.arch for p in parts if p.moe), base)  # the routed experts' part
    return replace(base, n_layers=L, n_dense_layers=L - n_moe, n_moe_layers=n_moe,
                   n_experts=top.n_experts, top_k=top.top_k, expert_ffn=top.expert_ffn,
                   n_shared=top.n_shared, shared_ffn=top.shared_ffn, hybrid=hy,
                   attention_flops=True)


# ---------------------------------------------------------------------------------- stages
def _stage_counts(hy: HybridArch, t: LayoutTable) -> dict[str, dict[str, np.ndarray]]:
    """Per stage (first, middle = rank 1, last) and letter, the layers of that type it holds."""
    L = len(hy.letters)
    pp, vp = t["pp"].astype(np.int64), t["vp"].astype(np.int64)
    first, mid, last, _ = stage_layer_counts(L, t)
    uneven = (t["lf"] > 0) | (t["ll"] > 0)
    chunk = L // np.maximum(pp * vp, 1)
    ranks = {"first": np.zeros_like(pp), "middle": np.where(pp > 2, 1, 0), "last": pp - 1}
    f_i = np.floor(first).astype(np.int64)
    m_i = np.floor(mid).astype(np.int64)
    l_i = np.floor(last).astype(np.int64)
    bounds = {"first": (np.zeros_like(pp), f_i), "middle": (f_i, np.minimum(f_i + m_i, L)),
              "last": (L - l_i, np.full_like(pp, L))}
    bounds["middle"] = tuple(np.where(pp == 2, b, m) for b, m in zip(bounds["first"], bounds["middle"]))
    out = {}
    vmax = int(vp.max()) if len(vp) else 1
    for name, r in ranks.items():
        counts = {}
        for k in LETTERS:
            cum = hy.cum[k]
            even = np.zeros(len(pp))
            for j in range(vmax):
                a = np.clip((j * pp + r) * chunk, 0, L)
                b = np.clip((j * pp + r + 1) * chunk, 0, L)
                even += np.where(j < vp, cum[b] - cum[a], 0.0)
            lo, hi = bounds[name]
            counts[k] = np.where(uneven, cum[hi] - cum[lo], even)
        out[name] = counts
    return out


def hybrid_stages(arch: Arch, t: LayoutTable, global_batch: int) -> dict:
    """`cost.stages.stages` for a hybrid model: the same stages with `counts` per layer type,
    `n_moe` the MoE layers and `n_dense` the others."""
    hy = arch.hybrid
    plain = stages(replace(arch, hybrid=None), t, global_batch)
    counts = _stage_counts(hy, t)
    out = {}
    for name, st in plain.items():
        c = counts[name]
        if hy.n_mtp:  # the MTP modules' layers run on the last stage (`HybridArch.mtp_letters`)
            c = dict(c)
            for k in hy.mtp_letters:
                c[k] = c[k] + np.asarray(st.mtp, dtype=np.float64)  # st.mtp: modules here
        n_moe = c[MOE]
        n_all = sum(c.values())
        out[name] = replace(st, n_dense=n_all - n_moe, n_moe=n_moe, counts=c)
    return out


def _part_stage(st, part: Part, carrier: bool):
    """The stage as one part sees it: only its type's layers; the embedding and the output layer
    on the carrier (the attention part) alone."""
    n = st.counts[part.letter]
    zero = np.zeros_like(np.asarray(n, dtype=np.float64))
    return replace(st, n_dense=zero if part.moe else n, n_moe=n if part.moe else zero,
                   embed=st.embed if carrier else zero, output=st.output if carrier else zero,
                   mtp=st.mtp if carrier else 0.0, counts=None)


_TIME_KEYS = ("fwd", "bwd", "rec", "tp", "cp", "ep", "host", "off", "wgrad", "nic_fwd", "nic_bwd")


def hybrid_stage_times(problem: Problem, arch: Arch, t: LayoutTable, groups) -> dict[str, dict]:
    """`cost.time.stage_times` of a hybrid model: each transformer part through the transformer
    ledger on its own layers (CP's ring exchange only for attention), plus the mixers."""
    hy = arch.hybrid
    sts = stages(arch, t, problem.training.global_batch)
    out = {name: {k: 0.0 for k in _TIME_KEYS} | {"stage": st} for name, st in sts.items()}
    for i, part in enumerate(hy.parts):
        res = stage_times(problem, part.arch, t, groups,
                          sts={name: _part_stage(st, part, i == 0) for name, st in sts.items()})
        for name in out:
            for k in _TIME_KEYS:
                if k == "cp" and not part.attention:
                    continue  # the ring KV exchange belongs to attention layers only
                out[name][k] = out[name][k] + res[name][k]
    if not hy.mixers:
        return out
    prof = problem.profile
    rc = t["rc"]
    cp = t["cp"].astype(np.float64)
    pair = tp_pair(problem, t, groups["tp"], hy.parts[0].arch)  # one block's pair
    for letter, mx in hy.mixers.items():
        gemm, scan, scan_bwd, elem = mixer_forward(problem, mx, t)
        fwd = gemm + scan + elem
        bwd = 2.0 * gemm + scan_bwd + 2.0 * elem
        a_in, a_out = mixer_cp_bytes(problem, mx, t)
        a2a = (collective_time(problem, Collective.ALL_TO_ALL, a_in, groups["cp"])
               + collective_time(problem, Collective.ALL_TO_ALL, a_out, groups["cp"]))
        for name, st in sts.items():
            n = st.counts[letter]
            full = st.recomputed
            if problem.training.tp_comm_overlap:
                tp = hidden_cost(prof, pair, gemm) * (1.0 + full) + hidden_cost(prof, pair, 2.0 * gemm)
            else:
                tp = pair * (2.0 + full)
            o = out[name]
            o["fwd"] = o["fwd"] + n * fwd
            o["bwd"] = o["bwd"] + n * bwd
            o["rec"] = o["rec"] + n * np.where(rc == 2, full * fwd, 0.0)
            o["tp"] = o["tp"] + n * tp
            # exposed: the scan needs the heads the all-to-all brings (forward, backward, and
            # once more for a recomputed forward)
            o["cp"] = o["cp"] + n * np.where(cp > 1, a2a * (2.0 + full), 0.0)
            o["wgrad"] = o["wgrad"] + n * gemm
    return out


def hybrid_stage_params(arch: Arch, t: LayoutTable, st) -> tuple[np.ndarray, np.ndarray]:
    """`cost.memory.stage_params` of a hybrid model: the parts' parameters on their layers plus
    the mixers' (TP-split except the pre-norm)."""
    hy = arch.hybrid
    dense = expert = 0.0
    for i, part in enumerate(hy.parts):
        d, e = stage_params(part.arch, t, _part_stage(st, part, i == 0))
        dense, expert = dense + d, expert + e
    tp = t["tp"].astype(np.float64)
    for letter, mx in hy.mixers.items():
        dense = dense + st.counts[letter] * (mx.sharded_params / tp + mx.hidden) * st.copies
    return dense, expert


def hybrid_activations(problem: Problem, arch: Arch, t: LayoutTable, st):
    """(activation bytes of the stage, one layer's bytes without recompute: the working set a
    full recompute re-materialises, the largest type present)."""
    hy = arch.hybrid
    none = np.zeros_like(t["rc"])
    total = 0.0
    largest = np.zeros(len(t))
    per_letter_none: dict[str, np.ndarray] = {}
    for part in hy.parts:
        a = layer_activation_bytes(problem, part.arch, t, moe=part.moe)
        total = total + st.counts[part.letter] * a
        a0 = layer_activation_bytes(problem, part.arch, t, moe=part.moe, recompute=none)
        per_letter_none[part.letter] = per_letter_none.get(part.letter, 0.0) + a0
    for letter, mx in hy.mixers.items():
        total = total + st.counts[letter] * mixer_activation_bytes(problem, mx, t)
        per_letter_none[letter] = mixer_activation_bytes(problem, mx, t, recompute=none)
    for letter, a0 in per_letter_none.items():
        if hy.count(letter):
            largest = np.maximum(largest, a0)
    activations = problem.stack.activation_factor * st.inflight * total
    return activations, largest
