"""Hand derivations of the time and memory ledgers, written out from their sources.

The ledger tests (`tests/test_ledger_terms.py`) compare every item of `estimate` with the numbers
below. Nothing here imports the cost model: the formulas are re-derived from the papers and
reference sections each line cites, with the problem's inputs (GPU datasheet numbers, the
profile's efficiency knobs, the job's dtypes) read from the `Problem` as data.

Communication is derived only inside one NVLink domain (every test cluster is one 8-GPU node),
where NCCL's ring is n - 1 steps per phase with the bus factors of nccl-tests PERFORMANCE.md
(all-reduce 2(n-1)/n, all-gather / reduce-scatter / all-to-all (n-1)/n) at the profile's share of
the NVLink spec, and NCCL's LL128 latency constants per step (reference §5.1-5.2). Groups that
cross nodes are tested for structure only (which link, how it scales).
"""

from __future__ import annotations

from dataclasses import dataclass

GiB = 2 ** 30


@dataclass(frozen=True)
class Dims:
    """A dense (optionally MoE) decoder, in the symbols of docs/cost-model.md."""

    L: int  # layers
    h: int  # hidden
    a: int  # query heads
    g: int  # KV heads
    d: int  # head width
    f: int  # dense FFN width
    V: int  # vocabulary
    swiglu: bool = True
    tied: bool = False
    E: int = 0  # routed experts
    k: int = 0  # top-k
    fe: int = 0  # expert FFN width
    n_shared: int = 0  # shared experts (each fe wide)
    n_dense: int = 0  # leading dense layers of a MoE model

    @property
    def q(self) -> int:
        return self.a * self.d

    @property
    def kv(self) -> int:
        return self.g * self.d

    @property
    def cf(self) -> int:
        """Korthikanti's MLP activation bytes per unit of f: GeLU 4 (FC1 output 2f + GeLU input
        2f), SwiGLU 6 (gate and up outputs 4f + the product 2f) (reference §3.4)."""
        return 6 if self.swiglu else 4

    @property
    def mlp_mats(self) -> int:
        return 3 if self.swiglu else 2


@dataclass(frozen=True)
class Lay:
    """A layout on one node: degrees, ZeRO, recompute (0 none, 2 full), SP, micro-batch."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    vp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    rc: int = 0
    sp: bool = False
    mb: int = 1
    cc: str = "ring"  # context-parallel form: ring, a2a, allgather, a2a+ring
    cu: int = 1  # a2a+ring: ranks per all-to-all group (the ring spans cp / cu of them)


class Hand:
    """The ledger of one problem, by hand."""

    def __init__(self, problem, dims: Dims):
        self.p, self.m = problem, dims
        gpu, prof = problem.cluster.gpu, problem.profile
        self.prof = prof
        self.peak = gpu.bf16_tflops * 1e12  # dense BF16 peak, datasheet
        self.hbm_bw = gpu.hbm_tb_per_s * 1e12
        self.nvlink = gpu.scaleup_gb_per_s * 1e9  # per GPU, one direction
        self.fp32_peak = (gpu.fp32_tflops or 0.0) * 1e12  # CUDA-core FP32 peak, datasheet
        self.s = problem.training.seq_len
        self.B = problem.training.global_batch
        # dropless routing with an auxiliary loss: the busiest EP rank's tokens over the balanced
        # share, a profile knob (`Profile.moe_dropless_imbalance`, docs/moe.md), read as data
        self.imbalance = prof.moe_dropless_imbalance

    # ---------------------------------------------------------------- kernels (reference §7.2)
    def gemm(self, M, N, K) -> float:
        """Roofline with a fixed cost: max(2MNK / (eta peak), 2(MK + KN + MN) / (eta_hbm BW))
        + t_fixed (reference §7.2 rules 1 and 3), bf16 operands."""
        P = self.prof
        math_s = 2.0 * M * N * K / (P.gemm_efficiency * self.peak)
        mem_s = 2.0 * (M * K + K * N + M * N) / (P.hbm_efficiency * self.hbm_bw)
        return max(math_s, mem_s) + P.gemm_overhead_us * 1e-6

    def attention(self, flops) -> float:
        P = self.prof
        eff = P.cudnn_attention_efficiency if self.p.training.attention == "cudnn" \
            else P.attention_efficiency
        return flops / (eff * self.peak)

    def hbm(self, nbytes) -> float:
        return nbytes / (self.prof.hbm_efficiency * self.hbm_bw)

    # ------------------------------------------------ collectives inside one NVLink domain
    def _lat(self, steps) -> float:
        P = self.prof
        return P.latency_base_us * 1e-6 + steps * P.latency_intra_hop_us * 1e-6

    def all_gather(self, S, n) -> float:
        """Ring all-gather of an S-byte output over n GPUs: n - 1 steps, (n-1)/n S per GPU
        (nccl-tests PERFORMANCE.md; reference §5.1)."""
        if n == 1:
            return 0.0
        return self._lat(n - 1) + (n - 1) / n * S / (self.prof.scaleup_efficiency * self.nvlink)

    reduce_scatter = all_gather  # same steps and bus factor (S = the input)

    def all_reduce(self, S, n) -> float:
        """Ring all-reduce, reduce-scatter then all-gather: 2(n - 1) steps, 2(n-1)/n S. Only for
        n <= 4 here (NCCL selects NVLS above 4 GPUs on NVSwitch boards, reference §6.2)."""
        assert n <= 4, "NVLS territory: not derived here"
        if n == 1:
            return 0.0
        return self._lat(2 * (n - 1)) + 2 * (n - 1) / n * S / (
            self.prof.scaleup_efficiency * self.nvlink)

    def all_to_all(self, S, n) -> float:
        """All-to-all of S bytes sent per GPU: (n-1)/n of it leaves, n - 1 peers."""
        if n == 1:
            return 0.0
        return self._lat(n - 1) + (n - 1) / n * S / (self.prof.scaleup_efficiency * self.nvlink)

    def p2p(self, S) -> float:
        """One message to a neighbour over NVLink: one step."""
        return self._lat(1) + S / (self.prof.scaleup_efficiency * self.nvlink)

    def hidden(self, comm, window) -> float:
        """What `comm` costs when it may hide behind `window` of compute: the excess, plus the SM
        share NCCL's kernels take from the compute they overlap (`overlap_sm_fraction`)."""
        exposed = max(0.0, comm - window)
        return exposed + self.prof.overlap_sm_fraction * (comm - exposed)

    # ---------------------------------------------------------------- per layer
    def tokens(self, x: Lay) -> float:
        return x.mb * self.s / x.cp

    def layer_params(self, x: Lay, moe: bool = False) -> tuple[float, float]:
        """(dense, expert) weights of one layer on one GPU (Megatron's estimator, reference
        §1.1): Q and O h q each over t; K and V h k_v each over min(t, g) (KV heads replicate
        beyond g, reference §3.4); MLP 3hf (SwiGLU) over t; two norms of h, replicated; MoE: a
        router hE (replicated), shared experts over t, routed experts E 3 h f_e over ep x t."""
        m, t = self.m, x.tp
        attn = 2 * m.h * m.q / t + 2 * m.h * m.kv / min(t, m.g) + 2 * m.h
        if not moe:
            return attn + m.mlp_mats * m.h * m.f / t, 0.0
        dense = attn + m.h * m.E + m.n_shared * m.mlp_mats * m.h * m.fe / t
        return dense, m.E * m.mlp_mats * m.h * m.fe / (x.ep * t)

    def layer_gemms(self, x: Lay, moe: bool = False) -> float:
        """Forward GEMM seconds of one layer, one micro-batch (M = b s / c tokens each)."""
        m, t, T = self.m, x.tp, self.tokens(x)
        up = 2 if m.swiglu else 1  # SwiGLU's FC1 computes gate and up: 2f columns
        out = self.gemm(T, m.q / t + 2 * m.kv / min(t, m.g), m.h)  # QKV
        out += self.gemm(T, m.h, m.q / t)  # output projection
        if not moe:
            return out + self.gemm(T, up * m.f / t, m.h) + self.gemm(T, m.h, m.f / t)
        # MoE block (Megatron-Core moe/: router.py, experts.py TEGroupedMLP, docs/moe.md): each
        # rank routes T_r = T / t tokens (SP shards the sequence; the expert-TP all-gather after
        # the all-to-all hands every expert-TP rank the k T_r copies of each of its t peers, so
        # it holds X = t k T_r = k T copies with expert-TP = TP), times the busiest rank's share
        # under dropless routing (the profile's `moe_dropless_imbalance`, read as data).
        # Router: T_r x h x E in fp32 on the CUDA cores (--moe-router-dtype fp32; the GPU's FP32
        # datasheet peak x the GEMM efficiency, plus the fixed kernel cost).
        T_r = T / t
        out += 2.0 * T_r * m.E * m.h / (self.prof.gemm_efficiency * self.fp32_peak) \
            + self.prof.gemm_overhead_us * 1e-6
        # experts: one grouped kernel per projection over the E / ep local experts, M_e = X / E_l
        # tokens each, f_e / t columns (each expert-TP rank holds f_e / t of every local
        # expert), plus the fitted per-expert tail `grouped_gemm_expert_us` per projection
        local = m.E / x.ep
        M_e = m.k * T * self.imbalance / local
        over = self.prof.gemm_overhead_us * 1e-6
        out += local * (self.gemm(M_e, up * m.fe / t, m.h) - over) + over
        out += local * (self.gemm(M_e, m.h, m.fe / t) - over) + over
        out += 2 * local * self.prof.grouped_gemm_expert_us * 1e-6
        if m.n_shared:
            fs = m.n_shared * m.fe
            out += self.gemm(T, up * fs / t, m.h) + self.gemm(T, m.h, fs / t)
        return out

    def layer_attention(self, x: Lay) -> float:
        """Causal core attention forward: b s^2 a (d_qk + d_v) FLOPs (half of the 4 b s^2 a d of
        QK^T and AV, reference §2.1), split over TP heads and CP chunks."""
        m = self.m
        return self.attention(x.mb * self.s ** 2 * m.a * 2 * m.d / (x.tp * x.cp))

    def layer_activations(self, x: Lay, moe: bool = False, recompute: int | None = None) -> float:
        """Bytes one layer keeps for its backward, one micro-batch (Korthikanti et al. 2022 Sec.
        4 generalised in reference §3.4; flash attention, no dropout): attention LN input 2h +
        QKV input 2h (whole on every TP rank without SP, /t with SP), Q 2q and the output
        projection's input 2q (/t), K and V 2k_v + 2k_v (/min(t, g)); MLP LN input 2h + FC1
        input 2h (as the attention's), c_f f (/t). MoE MLP (reference §3.5; docs/moe.md): LN and
        router inputs 2h + 2h and the fp32 router probabilities 4E (as the LN inputs); the X = k T
        x imbalance routed copies a rank holds (expert-TP = TP: the dispatcher all-gathers the
        received tokens over expert-TP, token_dispatcher.py `dispatch_postprocess`) keep each
        the expert FC1 input 2h whole, c_f f_e / t and the fp32 routing probability (4 bytes),
        which the activation multiplies in (Megatron-Core >= 0.13: "moving the probs
        multiplication from unpermutation to activation function", MoE README), so the combine
        keeps nothing; shared experts c_f f_e each (/t).
        Full recompute keeps the layer input, 2h (/t with SP)."""
        m, t, T = self.m, x.tp, self.tokens(x)
        rep = t if x.sp else 1
        rc = x.rc if recompute is None else recompute
        if rc == 2:
            return T * 2 * m.h / rep
        attn = (4 * m.h) / rep + (2 * m.q + 2 * m.q) / t + (2 * m.kv + 2 * m.kv) / min(t, m.g)
        if not moe:
            return T * (attn + 4 * m.h / rep + m.cf * m.f / t)
        routed = m.k * self.imbalance * (2 * m.h + m.cf * m.fe / t + 4)
        return T * (attn + (4 * m.h + 4 * m.E) / rep + routed + m.n_shared * m.cf * m.fe / t)

    def layer_elementwise(self, x: Lay, moe: bool = False) -> float:
        """Memory-bound kernels write and re-read what the layer stores, times the stack's
        fitted `elementwise_factor` (docs/cost-model.md "Elementwise")."""
        stored = self.layer_activations(x, moe, recompute=0)
        out = self.hbm(2 * self.prof.elementwise_factor * stored)
        if moe:  # the fused router reads and writes the fp32 T_r x E scores once (--moe-router-fusion)
            out += self.hbm(2 * 4 * self.tokens(x) / x.tp * self.m.E)
        return out

    def layer_forward(self, x: Lay, moe: bool = False) -> float:
        return self.layer_gemms(x, moe) + self.layer_attention(x) + self.layer_elementwise(x, moe)

    def layer_backward(self, x: Lay, moe: bool = False) -> float:
        """GEMMs and elementwise twice the forward (dgrad + wgrad), flash attention 2.5 x (its
        backward recomputes the scores; reference §2.4)."""
        return 2 * self.layer_gemms(x, moe) + 2.5 * self.layer_attention(x) \
            + 2 * self.layer_elementwise(x, moe)

    def logits_forward(self, x: Lay) -> float:
        """Output layer: the (T x h) @ (h x V/t) GEMM and the vocab-parallel cross-entropy's
        memory-bound kernels writing and re-reading bf16 logits and their fp32 copy, 2 (2 + 4)
        bytes per logit (reference §1.3)."""
        m, T = self.m, self.tokens(x)
        return self.gemm(T, m.V / x.tp, m.h) + self.hbm(2 * (2 + 4) * T * m.V / x.tp)

    # ---------------------------------------------------------------- stages
    def micro_batches(self, x: Lay) -> int:
        return self.B // (x.dp * x.mb)

    def stage_layers(self, x: Lay, stage: str) -> tuple[float, float]:
        """(dense, MoE) layers of the first / last stage, even split, dense layers first."""
        per = self.m.L / x.pp
        if not self.m.E:
            return per, 0.0
        before = 0 if stage == "first" else self.m.L - per
        dense = min(max(self.m.n_dense - before, 0), per)
        return dense, per - dense

    def stage_fwd_bwd(self, x: Lay, stage: str) -> tuple[float, float]:
        nd, nm = self.stage_layers(x, stage)
        fwd = nd * self.layer_forward(x) + (nm * self.layer_forward(x, True) if nm else 0.0)
        bwd = nd * self.layer_backward(x) + (nm * self.layer_backward(x, True) if nm else 0.0)
        if stage == "last" or x.pp == 1:
            fwd += self.logits_forward(x)
            bwd += 2 * self.logits_forward(x)
        return fwd, bwd

    def stage_params(self, x: Lay, stage: str) -> tuple[float, float]:
        """(dense, expert) weights on one GPU of the stage: its layers, the input embedding V h/t
        on the first stage, the output layer (or, tied with pp > 1, its copy) V h/t and the final
        norm h on the last."""
        m = self.m
        nd, nm = self.stage_layers(x, stage)
        dense = nd * self.layer_params(x)[0] + nm * self.layer_params(x, True)[0]
        expert = nm * self.layer_params(x, True)[1]
        first, last = stage == "first" or x.pp == 1, stage == "last" or x.pp == 1
        if first:
            dense += m.V * m.h / x.tp
        if last:
            dense += m.h + (m.V * m.h / x.tp if (not m.tied or x.pp > 1) else 0.0)
        return dense, expert

    # ---------------------------------------------------------------- communication items
    def tp_fwd_layer(self, x: Lay, moe: bool = False) -> float:
        """Forward TP collectives of one layer that may overlap the GEMMs (Megatron SP:
        all-gather before and reduce-scatter after the attention block and the MLP, of the
        2 b s h / c bf16 activation; without SP one all-reduce each; reference §5.5). A MoE
        layer: the attention block's pair and the shared experts' (a dense MLP's), its routed
        copies' gather being `etp_layer`."""
        S = 2 * self.tokens(x) * self.m.h

        def pair(nbytes):
            if x.sp:
                return self.all_gather(nbytes, x.tp) + self.reduce_scatter(nbytes, x.tp)
            return self.all_reduce(nbytes, x.tp)

        if not moe:
            return 2 * pair(S)
        return pair(S) + (pair(S) if self.m.n_shared and x.tp > 1 else 0.0)

    def etp_layer(self, x: Lay) -> float:
        """The expert-TP all-gather of the routed copies a rank received and the reduce-scatter
        of the expert outputs (Megatron-Core MoEAlltoAllTokenDispatcher `dispatch_postprocess` /
        `combine_preprocess`), once per pass: k x the 2 b s h / c bytes each (each of the t ranks
        received k T / t copies), exposed (they run on the compute stream)."""
        kS = self.m.k * 2 * self.tokens(x) * self.m.h
        return self.all_gather(kS, x.tp) + self.reduce_scatter(kS, x.tp)

    def cp_bytes(self, x: Lay) -> dict[str, float]:
        """Bytes per token one TP rank holds of Q (2 a d / t), K and V (2 g d / min(t, g) each)
        and the attention output (2 a d / t), bf16."""
        m, t = self.m, x.tp
        kv_t = min(t, m.g)
        return {"q": 2 * m.q / t, "k": 2 * m.kv / kv_t, "v": 2 * m.kv / kv_t, "o": 2 * m.q / t}

    def cp_layer(self, x: Lay, allgather_overlap: bool = False) -> float:
        """CP communication of one layer, one micro-batch, by form, every group inside one node:

        - ring (Liu et al. 2023; TE AttnFuncWithCPAndKVP2P; reference §5.6): c - 1 hops of this
          rank's K and V chunk, hidden behind one block of attention (1/c of the rank's
          forward); the backward sends K, V and dK, dV together, 2x, behind 2.5x;
        - a2a (DeepSpeed-Ulysses, arXiv 2309.14509 Sec. 3): all-to-all of Q, K, V (the rank's T
          tokens) before attention and of the output after it, the same for dO and dQ, dK, dV
          in the backward; nothing overlaps (attention needs every head's whole sequence);
        - allgather (Llama 3 report Sec. 3.3.2; TE AttnFuncWithCPAndKVAllGather: "exposed"):
          all-gather of K and of V (c T tokens out), again in the backward plus a reduce-scatter
          of dK and dV; or (PyTorch's rotater) each pass hidden behind its first block;
        - a2a+ring: the a2a over cu ranks, then the ring over c / cu with T cu tokens of 1/cu
          of the heads (the same K, V bytes per hop), each hop behind 1/(c/cu) of the attention.
        Full recompute repeats the forward's."""
        if x.cp == 1:
            return 0.0
        b, T, attn = self.cp_bytes(x), self.tokens(x), self.layer_attention(x)
        full = 1.0 if x.rc == 2 else 0.0
        out = 0.0
        if x.cc in ("ring", "a2a+ring"):
            r = x.cp // x.cu
            step = self.p2p(T * (b["k"] + b["v"]))
            fwd = (r - 1) * self.hidden(step, attn / r)
            bwd = (r - 1) * self.hidden(2 * step, 2.5 * attn / r)
            out += fwd * (1 + full) + bwd
        if x.cc in ("a2a", "a2a+ring"):
            u = x.cp if x.cc == "a2a" else x.cu
            one = sum(self.all_to_all(T * b[k], u) for k in ("q", "k", "v", "o"))
            out += one * (2 + full)
        if x.cc == "allgather":
            c = x.cp
            ag = self.all_gather(c * T * b["k"], c) + self.all_gather(c * T * b["v"], c)
            rs = self.reduce_scatter(c * T * b["k"], c) + self.reduce_scatter(c * T * b["v"], c)
            if allgather_overlap:
                fwd, bwd = self.hidden(ag, attn / c), self.hidden(ag + rs, 2.5 * attn / c)
            else:
                fwd, bwd = ag, ag + rs
            out += fwd * (1 + full) + bwd
        return out

    def cp_buffers(self, x: Lay) -> float:
        """Transient bytes of the form during a layer's attention (Transformer Engine's CP
        code): ring: the forward keeps each of its c steps' K, V receive buffers until it
        returns, the backward two double buffers (K V, dK dV): max(c, 4) x the rank's K, V;
        a2a: the head-major copy of Q, K, V and the all-to-all's receive buffers, 2 x;
        allgather: the gathered K, V and their per-step copies (forward), the gathered K, V
        and the whole-sequence dK, dV (backward): 2c x; a2a+ring: the ring's over c / cu and
        the a2a's."""
        if x.cp == 1:
            return 0.0
        b, T = self.cp_bytes(x), self.tokens(x)
        kv, qkv = T * (b["k"] + b["v"]), T * (b["q"] + b["k"] + b["v"])
        ring = max(x.cp // x.cu, 4) * kv
        return {"ring": ring, "a2a": 2 * qkv, "allgather": 2 * x.cp * kv,
                "a2a+ring": ring + 2 * qkv}[x.cc]

    def ep_layer(self, x: Lay) -> float:
        """The all-to-all dispatcher per MoE layer and micro-batch (Megatron-Core
        MoEAlltoAllTokenDispatcher): forward the k T / t routed copies' 2h bytes out (dispatch),
        as many back (combine) and their fp32 probabilities (4 bytes each, `permuted_probs`);
        backward the two 2h-byte ones again; full recompute repeats the forward. Exposed but for
        the profile's `ep_overlap`."""
        if x.ep == 1:
            return 0.0
        P = self.prof
        copies = self.m.k * self.tokens(x) / x.tp
        big = self.all_to_all(2 * copies * self.m.h, x.ep)
        fwd = 2 * big + self.all_to_all(4 * copies, x.ep)
        share = (1 - P.ep_overlap) + P.ep_overlap * P.overlap_sm_fraction
        return (fwd * (2 if x.rc == 2 else 1) + 2 * big) * share

    def host_layer(self) -> float:
        """Exposed host time per MoE layer and micro-batch with dynamic shapes and no CUDA
        graphs: the profile's `moe_host_overhead_us` (docs/moe.md "Host")."""
        return self.prof.moe_host_overhead_us * 1e-6

    def pp_item(self, x: Lay) -> float:
        """Fill and drain cross each of the p v - 1 chunk boundaries once each way (Narayanan et
        al. 2021): 2 (p v - 1) sends of the 2 b s h / (c t_SP) boundary activation."""
        if x.pp == 1:
            return 0.0
        S = 2 * self.tokens(x) * self.m.h / (x.tp if x.sp else 1)
        return 2 * (x.pp * x.vp - 1) * self.p2p(S)

    def dp_item(self, x: Lay, stage: str) -> float:
        """Data-parallel communication per step (reference §5.5-5.6), the gradients in the
        job's reduce dtype, bf16 parameter gathers, over the DP x CP group for dense weights and
        DP x CP / EP for experts; hidden behind a micro-batch's backward (forward for gathers),
        except the last bucket, max(4e7, 1e6 d) parameters (Megatron DDP `bucket_size`): ZeRO-0 one
        all-reduce; ZeRO-1 reduce-scatter + all-gather once per step; ZeRO-2 the reduce-scatter
        every micro-batch; ZeRO-3 an all-gather each way and a reduce-scatter every micro-batch."""
        gb = self.p.training.grad_reduce_bytes
        ov = self.prof.dp_overlap
        fwd, bwd = self.stage_fwd_bwd(x, stage)
        m = self.micro_batches(x)
        total = 0.0
        dense, expert = self.stage_params(x, stage)
        for psi, n in ((dense, x.dp * x.cp), (expert, x.dp * x.cp // x.ep)):
            if n == 1 or psi == 0:
                continue
            rs, ag = self.reduce_scatter(gb * psi, n), self.all_gather(2 * psi, n)
            bucket = gb * min(psi, max(4e7, 1e6 * n))
            tail = self.reduce_scatter(bucket, n)
            if x.zero == 0:  # buckets all-reduced (Megatron DDP without distributed optimizer)
                total += self.hidden(self.all_reduce(gb * psi, n), ov * bwd) \
                    + self.all_reduce(bucket, n)
            elif x.zero == 1:
                total += self.hidden(rs, ov * bwd) + self.hidden(ag, ov * fwd) + tail
            elif x.zero == 2:
                total += m * self.hidden(rs, ov * bwd) + self.hidden(ag, ov * fwd) + tail
            else:
                total += m * (self.hidden(ag, ov * fwd) + self.hidden(ag + rs, ov * bwd))
        return total

    def optimizer_item(self, x: Lay, stage: str) -> float:
        """Adam streams fp32 master, m and v (read + write, 24 bytes), writes the bf16 weight (2)
        and reads the gradient (its dtype) per locally owned parameter through HBM, plus the
        profile's fixed step overhead; with bf16 moments and no master copy it reads and writes
        the bf16 weight, m and v (12 bytes) and reads the gradient."""
        dense, expert = self.stage_params(x, stage)
        d = x.dp * x.cp
        shard = dense / (d if x.zero >= 1 else 1) + expert / (d // x.ep if x.zero >= 1 else 1)
        state = 26 if self.p.training.optimizer_dtype == "fp32" else 12
        return self.hbm(shard * (state + self.p.training.grad_bytes)) \
            + self.prof.step_overhead_ms * 1e-3

    # ---------------------------------------------------------------- stage per micro-batch
    def stage_tau(self, x: Lay, stage: str) -> float:
        """A stage's seconds per micro-batch: compute, recompute and its TP / CP / EP items."""
        fwd, bwd = self.stage_fwd_bwd(x, stage)
        nd, nm = self.stage_layers(x, stage)
        full = 1.0 if x.rc == 2 else 0.0
        rec = full * (nd * self.layer_forward(x) + (nm * self.layer_forward(x, True) if nm else 0))
        tp = nd * self.tp_fwd_layer(x) * (2 + full) + nm * self.tp_fwd_layer(x, True) * (2 + full)
        tp += nm * self.etp_layer(x) * (2 + full) if nm else 0.0
        cp = (nd + nm) * self.cp_layer(x)
        ep = nm * self.ep_layer(x)
        host = nm * self.host_layer() if nm else 0.0
        return fwd + bwd + rec + tp + cp + ep + host

    # ---------------------------------------------------------------- memory
    def inflight(self, x: Lay, stage: str) -> float:
        """Layer-micro-batches held at the peak, in units of the stage's layers x one
        micro-batch (Megatron's warm-up counts, reference §1.5): 1F1B rank r holds min(m, p - r);
        interleaved 2(p - r - 1) + (v - 1) p + 1 chunks of 1/v of the stage."""
        if x.pp == 1:
            return 1.0
        r = 0 if stage == "first" else x.pp - 1
        m = self.micro_batches(x)
        if x.vp == 1:
            return float(min(m, x.pp - r))
        return min(2 * (x.pp - r - 1) + (x.vp - 1) * x.pp + 1, m * x.vp) / x.vp

    def model_states(self, x: Lay, stage: str) -> dict[str, float]:
        """bf16 params 2, grads in the job's dtype, Adam 12 bytes per parameter (fp32 master, m,
        v); ZeRO-1 shards the 12, ZeRO-2 also the grads, ZeRO-3 also the params, over DP x CP
        (Megatron's distributed optimizer group), experts over DP x CP / EP (ZeRO paper Sec. 5;
        reference §1.2)."""
        dense, expert = self.stage_params(x, stage)
        d, de = x.dp * x.cp, x.dp * x.cp // x.ep

        def shard(nbytes, from_stage):
            on = x.zero >= from_stage
            return nbytes * (dense / (d if on else 1) + expert / (de if on else 1))

        return {"params": shard(2, 3), "grads": shard(self.p.training.grad_bytes, 2),
                "optimizer": shard(12, 1)}

    def activations(self, x: Lay, stage: str) -> float:
        nd, nm = self.stage_layers(x, stage)
        per = nd * self.layer_activations(x) + (nm * self.layer_activations(x, True) if nm else 0)
        return self.p.stack.activation_factor * self.inflight(x, stage) * per

    def embedding_logits(self, x: Lay, stage: str) -> float:
        """First stage: int64 token ids per in-flight micro-batch; last: the final norm's output
        and the output layer's input 2h + 2h (/t with SP) and the fp32 logits 4V/t of the
        vocab-parallel cross-entropy per token (reference §1.3)."""
        T, m = self.tokens(x), self.m
        out = 0.0
        if stage == "first" or x.pp == 1:
            out += self.inflight(x, "first") * 8 * T
        if stage == "last" or x.pp == 1:
            out += T * (4 * m.h / (x.tp if x.sp else 1) + 4 * m.V / x.tp)
        return out
