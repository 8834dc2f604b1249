"""Multi-head attention with pluggable scores and normalisation.

Scores:   dot     q.k / sqrt(d_head)                     (Vaswani et al.)
          qknorm  g * (q/||q||_p) . (k/||k||_p)            (Henry et al. 2020; Lp: p >= 1)
Weights:  softmax over keys
          dnas    one Sinkhorn step: normalise over queries, then over keys (doubly-normalised attention)
          hnas    u * dnas + (1 - u) * softmax, u = sigmoid(learned scalar), one per module

The module keeps fairseq's MultiheadAttention interface (key padding masks, attn_mask, incremental
state with cached keys/values, static_kv, beam reordering, need_weights/need_head_weights) and
replaces its forward: fairseq's own forward sends encoder self-attention and teacher-forced decoder
self-attention through F.multi_head_attention_forward, which no subclass hook can reach.
"""
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.modules import MultiheadAttention
from torch import Tensor, nn

from .norms import _fp32_norm, l2_normalize

# --*-attention NAME -> (scores, weights)
ATTENTIONS = {"softmax": ("dot", "softmax"), "qknorm": ("qknorm", "softmax"), "dnas": ("dot", "dnas"),
              "hnas": ("dot", "hnas"), "qknorm+dnas": ("qknorm", "dnas"), "qknorm+hnas": ("qknorm", "hnas")}


EPS = 1e-6  # the floor of QKNorm's norms


def power_floor(eps, p):
    """The floor of the sum of p-th powers for a norm floored at EPS. The sum is clamped, not the
    norm: d/ds s^(-1/p) is infinite at s = 0 and would turn a zero vector's gradient into NaN; the
    floor stays a normal fp32 number for large p."""
    return max(eps ** p, torch.finfo(torch.float32).tiny)


def lp_normalize(x, p, eps=EPS, out=None):
    """x / max(||x||_p, eps) along the last dim, computed in fp32 (non-integer p is fragile in half
    precision); written into OUT when given (no autograd; OUT may be x)."""
    if p == 2:
        return l2_normalize(x, eps) if out is None else torch.div(x, _fp32_norm(x).clamp(min=eps), out=out)
    xf = x.float()
    # torch.linalg.vector_norm(ord=p) for p != 2 takes a generic kernel many times slower than these
    # elementwise ops on CPU (`python -m qknorm_pipeline.benchmark kernels`). Even p skips abs().
    if p == 4:
        powered = xf.square().square()
    elif p % 2 == 0:
        powered = xf.square().pow(p / 2)
    else:
        powered = xf.abs().pow(p)
    scale = powered.sum(dim=-1, keepdim=True).clamp(min=power_floor(eps, p)).pow(-1.0 / p)
    return (xf * scale).type_as(x) if out is None else torch.mul(xf, scale, out=out)


def dnas_log_weights(scores, query_pad=None):
    """log xi for DNAS: scores minus their logsumexp over queries (dim -2), padded queries excluded.

    scores: (..., n_queries, n_keys) with key masks NOT yet applied, so every column has a finite
    logsumexp and no NaN reaches the backward pass. query_pad: bool (..., n_queries, 1), True = pad.
    """
    over_queries = scores if query_pad is None else scores.masked_fill(query_pad, float("-inf"))
    return scores - torch.logsumexp(over_queries, dim=-2, keepdim=True)


def stamp(t: Optional[Tensor]):
    """t with its version counter now, for `unchanged` to test a later tensor against."""
    return None if t is None else (t, None if t.is_inference() else t._version)


def unchanged(stamped, t: Optional[Tensor]) -> bool:
    """Whether t holds the values the stamped tensor held when stamped, because it is that memory,
    not written since: the same object, or a view of the same storage with the same offset, shape,
    strides and dtype (fairseq's decoder slices its future mask anew for every layer). The stamp
    keeps its tensor alive, so that memory cannot have been freed and reused by t."""
    if stamped is None or t is None:
        return stamped is None and t is None
    a, version = stamped
    if version is None or t.is_inference():  # inference tensors count no writes: the object itself only
        return a is t
    return t._version == version and (a is t or (
        a.data_ptr() == t.data_ptr() and a.device == t.device and a.dtype == t.dtype and a.shape == t.shape
        and a.stride() == t.stride()))


class NormAttention(MultiheadAttention):
    def __init__(self, embed_dim, num_heads, kdim=None, vdim=None, dropout=0.0, self_attention=False,
                 encoder_decoder_attention=False, attention_type="softmax", qknorm_p=2.0, qknorm_g0=1.0,
                 causal=False, fast_dropout=False, attention_kernel="sdpa", fused_kernels=False):
        super().__init__(embed_dim, num_heads, kdim=kdim, vdim=vdim, dropout=dropout,
                         self_attention=self_attention, encoder_decoder_attention=encoder_decoder_attention)
        self.fast_dropout = fast_dropout
        self.attention_kernel = attention_kernel
        self.fused_kernels = fused_kernels
        if fused_kernels:
            from . import fused_kernels as kernels  # imported only here: it imports torch._dynamo (2 s)

            self._compiled_normalize, self._l2_grids = kernels.lp_normalize, kernels.l2_grids
            for projection in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
                kernels.RowsLinear.swap(projection)
            self._fits_softmax_dropout, self._softmax_dropout = kernels.fits_softmax_dropout, kernels.softmax_dropout
            self._linears = kernels.linears
            from . import step_attention

            self._fits_step, self._step_attention = step_attention.fits, step_attention.attention
        if fast_dropout:
            from .fast_dropout import swap_dropouts  # imported only here: see model._swap_dropouts

            swap_dropouts(self)
        self.scores, self.weights = ATTENTIONS[attention_type]
        self.attention_type = attention_type
        if self.scores == "qknorm":
            self.p = float(qknorm_p)
            self.qk_scale = nn.Parameter(torch.tensor(float(qknorm_g0)))
        if self.weights in ("dnas", "hnas") and not self_attention:
            raise ValueError(f"{attention_type} attention normalises over queries and needs self-attention")
        if self.weights == "hnas":
            self.hnas_logit = nn.Parameter(torch.zeros(()))  # u = sigmoid(0) = 0.5
        # decoder self-attention: its attn_mask is always fairseq's future mask
        self.causal = causal

    def extra_repr(self):
        return f"attention_type={self.attention_type}, heads={self.num_heads}, causal={self.causal}"

    @property
    def hnas_u(self):
        return torch.sigmoid(self.hnas_logit)

    def _heads(self, x, bsz):
        # (len, bsz, embed) -> (bsz, heads, len, head_dim)
        return x.contiguous().view(x.size(0), bsz, self.num_heads, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, query, key: Optional[Tensor], value: Optional[Tensor],
                key_padding_mask: Optional[Tensor] = None,
                incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
                need_weights: bool = True, static_kv: bool = False, attn_mask: Optional[Tensor] = None,
                before_softmax: bool = False, need_head_weights: bool = False):
        if before_softmax:
            raise NotImplementedError("NormAttention does not return pre-softmax scores (before_softmax=True)")
        need_weights = need_weights or need_head_weights
        tgt_len, bsz, _ = query.size()

        saved_state = None
        if incremental_state is not None:
            saved_state = self._get_input_buffer(incremental_state)
            if "prev_key" in saved_state and static_kv:
                key = value = None  # cross-attention: keys/values of the source are cached

        q = self.query_heads(query, bsz)
        k = v = None
        if self.self_attention:
            k, v = self.key_value_heads(query, query, bsz)
        elif key is not None:
            k, v, key_padding_mask = self.source_keys(key, value, key_padding_mask, bsz)
        kv_bsz = k.size(0) if k is not None else bsz

        if saved_state is not None:
            if "prev_key" in saved_state:
                prev_k, prev_v = saved_state["prev_key"], saved_state["prev_value"]
                kv_bsz = prev_k.size(0)
                k = prev_k if static_kv else torch.cat([prev_k, k], dim=2)
                v = prev_v if static_kv else torch.cat([prev_v, v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask, prev_key_padding_mask=saved_state.get("prev_key_padding_mask"),
                batch_size=kv_bsz, src_len=k.size(2), static_kv=static_kv)
            saved_state["prev_key"], saved_state["prev_value"] = k, v
            saved_state["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved_state)
        if key_padding_mask is not None:
            key_padding_mask = key_padding_mask.bool()

        out, weights = self.attend(q, k, v, key_padding_mask, attn_mask, explicit=need_weights,
                                   step=incremental_state is not None)
        if weights is not None:
            weights = weights.reshape(bsz, self.num_heads, tgt_len, -1).transpose(0, 1)  # (heads, bsz, tgt, src)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def forward_rows(self, x, rows, key=None, key_padding_masks=None, attn_mask=None, key_rows=None):
        """Training attention of queries given as rows X (N, embed) of a batch's sentences (decoder_rows.Rows:
        its tokens, then its padding rows, whose outputs are out_proj's of zeros), through out_proj: (N, embed);
        the cores run per length group of ROWS, on its grid. Self-attention
        takes its keys and values from the same rows, scattered into zeros at the pads (masked keys),
        ATTN_MASK the future mask; encoder-decoder attention from KEY, the source (src_len, bsz, embed) or,
        with KEY_ROWS (the source's Rows, one group), its rows, with KEY_PADDING_MASKS the source's padding
        per group (Rows.split)."""
        def heads(y):
            return y.view(-1, self.num_heads, self.head_dim)

        if self.self_attention:
            q, k, v = self._linears(x, self.q_proj, self.k_proj, self.v_proj)
        else:
            q = self.q_proj(x)
        qs, scaled = self._qknorm_grids(heads(q), rows, with_g=self.weights == "softmax")
        if self.self_attention:
            ks, _ = self._qknorm_grids(heads(k), rows)
            vs = rows.grids(heads(v))
        elif key_rows is not None:
            k, v = self._linears(key, self.k_proj, self.v_proj)
            ((k,), _), (v,) = self._qknorm_grids(heads(k), key_rows), key_rows.grids(heads(v))
            ks, vs = rows.split(k), rows.split(v)
        else:
            k, v, _ = self.source_keys(key, key, None, rows.bsz)
            ks, vs = rows.split(k), rows.split(v)
        outs = []
        for i, group in enumerate(rows.groups):
            if self.self_attention:
                pad, mask = group.key_pad, None if attn_mask is None else attn_mask[:group.length, :group.length]
            else:
                pad, mask = key_padding_masks[i], None
                pad = None if pad is None else pad.bool()
            if self.weights == "softmax":
                outs.append(self._fused(qs[i], ks[i], vs[i], pad, mask, scaled=scaled))
            else:  # DNAS/HNAS, in encoder self-attention only (check_args)
                outs.append(self._explicit(qs[i], ks[i], vs[i], pad, mask)[0])
        return self.out_proj(rows.from_grids(outs))

    @staticmethod
    def _linears(x, *layers):
        """Each of LAYERS applied to X (with --fused-kernels fused_kernels.linears: one autograd node)."""
        return [layer(x) for layer in layers]

    def query_heads(self, query, bsz):
        """The projected queries, (bsz, heads, len, head_dim); QKNorm: normalised."""
        return self._qknorm(self._heads(self.q_proj(query), bsz))

    def key_value_heads(self, key, value, kv_bsz):
        """The projected keys and values, (kv_bsz, heads, len, head_dim) each; QKNorm's keys
        normalised before any caching: incremental decoding then normalises each key once, not every
        cached key (and the whole source, in cross-attention) again at every step."""
        k, v = self._heads(self.k_proj(key), kv_bsz), self._heads(self.v_proj(value), kv_bsz)
        return self._qknorm(k), v

    def _qknorm(self, x):
        """QKNorm's l_p normalisation of queries or keys (per head); other scores: x as it is."""
        if self.scores != "qknorm":
            return x
        if self.fused_kernels and self.training:
            return self._compiled_normalize(x, self.p, EPS)
        return lp_normalize(x, self.p)

    def _qknorm_grids(self, x, rows, with_g=False):
        """ROWS' groups' grids of X (N, heads, head_dim) QKNorm-normalised (_qknorm), and whether QKNorm's g is
        applied too (WITH_G: where the C loops normalise them straight into the grids, g with them)."""
        if self.scores == "qknorm" and self.fused_kernels and self.training and self.p == 2:
            grids = self._l2_grids(x, rows, EPS, self.qk_scale if with_g else None)
            if grids is not None:
                return list(grids), with_g
        return rows.grids(self._qknorm(x)), False

    def source_keys(self, key, value, key_padding_mask, bsz):
        """Encoder-decoder attention's keys, values and key padding mask for a batch of bsz queries. In
        beam search (bsz = sentences x beam_size) every beam of a sentence shares the source: one
        copy per sentence, as fairseq keeps it."""
        if self.encoder_decoder_attention and self.beam_size > 1 and key.size(1) == bsz:
            key = key.view(key.size(0), -1, self.beam_size, key.size(2))[:, :, 0, :]
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.view(-1, self.beam_size, key_padding_mask.size(1))[:, 0]
            value = key
        return (*self.key_value_heads(key, value, key.size(1)), key_padding_mask)

    def attend(self, q, k, v, key_padding_mask=None, attn_mask=None, explicit=False, step=False):
        """The attention of q (bsz, heads, tgt, head_dim) over k and v (kv_bsz, heads, src, head_dim),
        through out_proj: (out (tgt, bsz, embed), weights). bsz may be a multiple of kv_bsz: the beams
        of a sentence over its one copy of the source. With `explicit` (and always for DNAS/HNAS) the
        weights are computed as such and returned, (bsz, heads, tgt, src): another rounding than the
        fused kernel's; otherwise weights is None. STEP: a decoding step's (_fused)."""
        bsz, _, tgt_len, _ = q.shape
        kv_bsz = k.size(0)
        beams = bsz // kv_bsz
        if beams > 1:
            # fold the beams of one sentence into the query axis: (kv_bsz, heads, beams*tgt, d)
            q = q.view(kv_bsz, beams, self.num_heads, tgt_len, self.head_dim).transpose(1, 2)
            q = q.reshape(kv_bsz, self.num_heads, beams * tgt_len, self.head_dim)
            if attn_mask is not None:
                attn_mask = attn_mask.repeat(beams, 1)

        if self.weights == "softmax" and not explicit:
            out, weights = self._fused(q, k, v, key_padding_mask, attn_mask, step=step), None
        else:
            looped = self._step_loop(q, k, v, key_padding_mask, attn_mask, with_weights=True) if step else None
            out, weights = looped or self._explicit(q, k, v, key_padding_mask, attn_mask)

        if beams > 1:
            out = out.view(kv_bsz, self.num_heads, beams, tgt_len, self.head_dim).transpose(1, 2)
            if weights is not None:
                weights = weights.view(kv_bsz, self.num_heads, beams, tgt_len, -1).transpose(1, 2)
        out = out.reshape(bsz, self.num_heads, tgt_len, self.head_dim).permute(2, 0, 1, 3)
        return self.out_proj(out.reshape(tgt_len, bsz, self.embed_dim)), weights

    def _fused(self, q, k, v, key_padding_mask, attn_mask, scaled=False, step=False):
        """Softmax attention in the weights' precision: through scaled_dot_product_attention (fused
        kernels where available) or, with --attention-kernel matmul, as matmul, softmax, matmul; a decoding
        STEP's, with --fused-kernels, through step_attention's C loop where it takes them. SCALED: QKNorm's g
        is in q already."""
        dropout_p = self.dropout_module.p if self.training else 0.0
        # scaled_dot_product_attention draws its own dropout mask (bernoulli_): --fast-dropout's mask
        # needs the steps spelt out
        explicit = self.attention_kernel == "matmul" or (self.fast_dropout and dropout_p > 0)
        if step:  # the C loop reads the decoder cache's keys where they lie, where matmul would copy them
            looped = self._step_loop(q, k, v, key_padding_mask, attn_mask, scaled=scaled)
            if looped is not None:
                return looped[0]
        if explicit:
            # each head's rows in memory order: matmul copies a permuted view (the heads of a
            # (len, bsz, embed) projection) inside each product, forward and backward, more slowly
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        q, scale = self._fold_scale(q, scaled)
        if explicit:
            scores = torch.matmul(q if scale == 1.0 else q * scale, k.transpose(-1, -2))
            mask = self._additive_mask(key_padding_mask, attn_mask, q.dtype)
            if (self.fused_kernels and self.training and (dropout_p == 0 or self.fast_dropout) and dropout_p < 1
                    and self._fits_softmax_dropout(scores, mask)):
                return torch.matmul(self._softmax_dropout(scores, mask, dropout_p), v)
            if mask is not None:
                scores = scores + mask
            probs = torch.softmax(scores, dim=-1)  # CPU and CUDA kernels accumulate half precision in fp32
            return torch.matmul(self.dropout_module(probs), v)
        is_causal = self.causal and attn_mask is not None and key_padding_mask is None and q.size(2) == k.size(2)
        mask = None
        if not is_causal:
            mask = self._additive_mask(key_padding_mask, attn_mask, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale)

    def _fold_scale(self, q, scaled=False):
        """(q, the scores' scale): QKNorm's g folded into q (unless SCALED: there already), else fairseq's."""
        if self.scores == "qknorm":
            return q if scaled else q * self.qk_scale.to(q.dtype), 1.0
        return q, self.scaling

    def _step_loop(self, q, k, v, key_padding_mask, attn_mask, scaled=False, with_weights=False):
        """A decoding step's softmax attention through step_attention's C loop (--fused-kernels, evaluation,
        a CPU): (out, the weights (bsz, heads, tgt, src) in fp32 WITH_WEIGHTS, else None); None where the loop
        does not take them. The output is the same bits with or without the weights, so the layer fairseq asks
        for weights (the last one's cross-attention) rounds as every other layer."""
        if not (self.fused_kernels and not self.training and self.weights == "softmax"):
            return None
        q, scale = self._fold_scale(q, scaled)
        mask = self._additive_mask(key_padding_mask, attn_mask, q.dtype)
        if not self._fits_step(q, k, v, mask):
            return None
        if with_weights:
            return self._step_attention(q, k, v, mask, scale, with_weights=True)
        return self._step_attention(q, k, v, mask, scale), None

    # the last additive masks built, keyed by the mask tensors they were built from: every
    # encoder layer and every cross-attention receive the same source mask, every decoder
    # self-attention the same target masks, so each mask is built once per forward, not once per
    # layer (a decoder layer alternates the two, hence two entries and a spare; the packed decoder
    # has two per length group: up to --packed-groups 3 each built once per forward)
    _mask_cache = []
    _MASKS_KEPT = 7

    def _additive_mask(self, key_padding_mask, attn_mask, dtype):
        if torch.compiler.is_compiling():  # the cache's identity tests would cost a compiled layer a recompile
            return self._build_additive_mask(key_padding_mask, attn_mask, dtype)
        for kpm, am, dt, mask in NormAttention._mask_cache:
            if dt == dtype and unchanged(kpm, key_padding_mask) and unchanged(am, attn_mask):
                return mask
        mask = self._build_additive_mask(key_padding_mask, attn_mask, dtype)
        NormAttention._mask_cache = [(stamp(key_padding_mask), stamp(attn_mask), dtype, mask),
                                     *NormAttention._mask_cache[:NormAttention._MASKS_KEPT - 1]]
        return mask

    @staticmethod
    def _build_additive_mask(key_padding_mask, attn_mask, dtype):
        mask = None
        if attn_mask is not None:
            mask = attn_mask.to(dtype) if attn_mask.is_floating_point() else \
                torch.zeros_like(attn_mask, dtype=dtype).masked_fill(attn_mask.bool(), float("-inf"))
        if key_padding_mask is not None:
            pad = torch.zeros(key_padding_mask.shape, dtype=dtype, device=key_padding_mask.device)
            pad = pad.masked_fill(key_padding_mask, float("-inf"))[:, None, None, :]
            mask = pad if mask is None else mask + pad
        return mask

    def _explicit(self, q, k, v, key_padding_mask, attn_mask):
        """Attention with explicit weights (needed for DNAS/HNAS and when weights are requested)."""
        if self.scores == "qknorm":
            scores = self.qk_scale * torch.matmul(q.float(), k.float().transpose(-1, -2))
        else:
            scores = torch.matmul(q.float() * self.scaling, k.float().transpose(-1, -2))
        mask = self._additive_mask(None, attn_mask, torch.float32)
        if mask is not None:
            scores = scores + mask
        key_pad = None if key_padding_mask is None else key_padding_mask[:, None, None, :]

        def over_keys(s):
            if key_pad is not None:
                s = s.masked_fill(key_pad, float("-inf"))
            return torch.softmax(s, dim=-1)

        if self.weights == "softmax":
            probs = over_keys(scores)
        else:
            # DNAS runs in encoder self-attention only, where query i is key i: reuse the key mask.
            query_pad = None if key_padding_mask is None else key_padding_mask[:, None, :, None]
            probs = over_keys(dnas_log_weights(scores, query_pad))
            if self.weights == "hnas":
                u = self.hnas_u
                probs = u * probs + (1 - u) * over_keys(scores)
        weights = probs
        probs = self.dropout_module(probs).to(v.dtype)
        return torch.matmul(probs, v), weights
