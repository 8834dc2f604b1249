"""NormAttention against naive implementations of each formula, written independently here."""
import math

import pytest
import torch

from qknorm_fairseq.attention import NormAttention, lp_normalize

torch.manual_seed(0)
D, H = 16, 4
HD = D // H


def naive(attn, x_q, x_kv, key_pad=None, causal=False):
    """Loop-based reference: per batch, per head, per query; returns (out, weights[b, h, i, j])."""
    T, B, _ = x_q.shape
    S = x_kv.shape[0]
    q = attn.q_proj(x_q).view(T, B, H, HD)
    k = attn.k_proj(x_kv).view(S, B, H, HD)
    v = attn.v_proj(x_kv).view(S, B, H, HD)
    W = torch.zeros(B, H, T, S)
    out = torch.zeros(T, B, H, HD)
    for b in range(B):
        valid_k = [j for j in range(S) if key_pad is None or not key_pad[b, j]]
        valid_q = [i for i in range(T) if attn.weights == "softmax" or key_pad is None or not key_pad[b, i]]
        for h in range(H):
            s = torch.full((T, S), float("-inf"))
            for i in range(T):
                for j in valid_k:
                    if causal and j > i:
                        continue
                    if attn.scores == "qknorm":
                        qi = q[i, b, h] / q[i, b, h].abs().pow(attn.p).sum().pow(1 / attn.p)
                        kj = k[j, b, h] / k[j, b, h].abs().pow(attn.p).sum().pow(1 / attn.p)
                        s[i, j] = attn.qk_scale * (qi @ kj)
                    else:
                        s[i, j] = (q[i, b, h] @ k[j, b, h]) / math.sqrt(HD)
            soft = torch.zeros(T, S)
            for i in range(T):
                e = torch.exp(s[i] - s[i].max())
                soft[i] = e / e.sum()
            if attn.weights == "softmax":
                w = soft
            else:
                # xi: normalise exp(s) over the valid queries of each key, then pi over keys
                e = torch.exp(s)
                xi = torch.zeros(T, S)
                for j in valid_k:
                    xi[:, j] = e[:, j] / sum(e[i2, j] for i2 in valid_q)
                pi = xi / xi.sum(dim=1, keepdim=True)
                w = pi if attn.weights == "dnas" else attn.hnas_u * pi + (1 - attn.hnas_u) * soft
            W[b, h] = w
            out[:, b, h] = w @ v[:, b, h]
    out = attn.out_proj(out.reshape(T, B, D))
    return out, W


def make(kind, **kw):
    attn = NormAttention(D, H, self_attention=kw.pop("self_attention", True), attention_type=kind,
                         qknorm_g0=kw.pop("g0", 3.0), **kw)
    if attn.weights == "hnas":
        attn.hnas_logit.data.fill_(0.7)  # u != 0.5 so a wrong mixture would show
    return attn.eval()


def padded_batch(B=3, T=6):
    x = torch.randn(T, B, D)
    pad = torch.zeros(B, T, dtype=torch.bool)
    pad[1, -2:] = True
    pad[2, -1:] = True
    return x, pad


@pytest.mark.parametrize("kind,p", [("softmax", 2), ("qknorm", 2), ("qknorm", 3.5), ("dnas", 2), ("hnas", 2),
                                    ("qknorm+dnas", 2), ("qknorm+hnas", 1.5)])
def test_encoder_self_attention_matches_naive(kind, p):
    attn = make(kind, qknorm_p=p)
    x, pad = padded_batch()
    with torch.no_grad():
        ref_out, ref_w = naive(attn, x, x, key_pad=pad)
        out, w = attn(x, x, x, key_padding_mask=pad, need_weights=True, need_head_weights=True)
        fast, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
        attn.attention_kernel = "matmul"
        matmul, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
    valid = ~pad.t()[:, :, None]  # outputs at padded positions are unused
    assert torch.allclose(out * valid, ref_out * valid, atol=1e-5)
    assert torch.allclose(fast * valid, ref_out * valid, atol=1e-5)
    assert torch.allclose(matmul * valid, ref_out * valid, atol=1e-5)
    w = w.transpose(0, 1)  # (bsz, heads, tgt, src)
    for b in range(3):
        n = int((~pad[b]).sum())
        assert torch.allclose(w[b, :, :n, :n], ref_w[b, :, :n, :n], atol=1e-5)
        assert torch.all(w[b, :, :, n:] == 0), "padded keys must get zero weight"
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("kind", ["softmax", "qknorm"])
def test_causal_self_attention_matches_naive(kind):
    attn = make(kind)
    x = torch.randn(5, 2, D)
    future = torch.triu(torch.full((5, 5), float("-inf")), 1)
    with torch.no_grad():
        ref_out, ref_w = naive(attn, x, x, causal=True)
        attn.causal = False  # explicit mask path
        out, w = attn(x, x, x, attn_mask=future, need_head_weights=True)
        attn.causal = True  # is_causal fast path
        fast, _ = attn(x, x, x, attn_mask=future, need_weights=False)
        attn.attention_kernel = "matmul"
        matmul, _ = attn(x, x, x, attn_mask=future, need_weights=False)
    assert torch.allclose(out, ref_out, atol=1e-5)
    assert torch.allclose(fast, ref_out, atol=1e-5)
    assert torch.allclose(matmul, ref_out, atol=1e-5)
    assert torch.allclose(w.transpose(0, 1), ref_w, atol=1e-5)


@pytest.mark.parametrize("kind", ["softmax", "qknorm"])
def test_cross_attention_matches_naive(kind):
    attn = make(kind, self_attention=False, encoder_decoder_attention=True)
    q, (kv, pad) = torch.randn(4, 3, D), padded_batch()
    with torch.no_grad():
        ref_out, _ = naive(attn, q, kv, key_pad=pad)
        out, _ = attn(q, kv, kv, key_padding_mask=pad, need_weights=False, static_kv=True)
        attn.attention_kernel = "matmul"
        matmul, _ = attn(q, kv, kv, key_padding_mask=pad, need_weights=False, static_kv=True)
    assert torch.allclose(out, ref_out, atol=1e-5)
    assert torch.allclose(matmul, ref_out, atol=1e-5)


@pytest.mark.parametrize("kind", ["softmax", "qknorm"])
def test_matmul_kernel_trains_as_sdpa_and_drops_attention_weights(kind):
    """--attention-kernel matmul: the gradients of scaled_dot_product_attention's, and in training
    with attention dropout the weights of the need_weights path times torch's dropout mask."""
    x, pad = padded_batch()
    grads = {}
    for kernel in ("sdpa", "matmul"):
        torch.manual_seed(1)
        attn = make(kind, attention_kernel=kernel).train()  # dropout 0: the two paths are deterministic
        x_ = x.clone().requires_grad_()
        out, _ = attn(x_, x_, x_, key_padding_mask=pad, need_weights=False)
        (out * ~pad.t()[:, :, None]).square().sum().backward()
        grads[kernel] = [x_.grad] + [p.grad for p in attn.parameters()]
    for a, b in zip(grads["sdpa"], grads["matmul"]):
        assert torch.allclose(a, b, atol=1e-5)

    attn = make(kind, attention_kernel="matmul", dropout=0.5)
    with torch.no_grad():
        _, w = attn(x, x, x, key_padding_mask=pad, need_head_weights=True)  # eval: no dropout
        v = attn.v_proj(x).view(6, 3, H, HD).permute(1, 2, 0, 3)
        attn.train()
        torch.manual_seed(7)
        out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
        torch.manual_seed(7)
        kept = torch.nn.functional.dropout(torch.ones(3, H, 6, 6), 0.5)  # the mask of the same draw
    expected = torch.matmul(w.transpose(0, 1) * kept, v).permute(2, 0, 1, 3).reshape(6, 3, D)
    assert torch.allclose(out, attn.out_proj(expected), atol=1e-5)
    assert not torch.allclose(out, attn.eval()(x, x, x, key_padding_mask=pad, need_weights=False)[0], atol=1e-3)


@pytest.mark.parametrize("kind", ["softmax", "qknorm"])
def test_matmul_kernel_products_take_the_heads_without_copying_the_keys(kind):
    """--attention-kernel matmul makes each head's rows contiguous once: its bf16 products (oneDNN's,
    at a model's sizes) then take the keys as they are, where they copied the permuted view of the
    keys, transposed, in the forward and again in the backward."""
    torch.manual_seed(0)
    d, heads, bsz, length = 256, 4, 4, 40
    attn = NormAttention(d, heads, self_attention=True, attention_type=kind, attention_kernel="matmul").train().bfloat16()
    x = torch.randn(length, bsz, d, dtype=torch.bfloat16, requires_grad=True)
    with torch.profiler.profile(record_shapes=True) as prof:
        out, _ = attn(x, x, x, need_weights=False)
        out.float().square().sum().backward()
    copied = [e.input_shapes[0] for e in prof.events() if e.name == "aten::copy_"]
    assert [bsz * heads, d // heads, length] not in copied, copied
    assert x.grad.abs().sum() > 0


def test_dnas_rows_sum_to_one_and_lemma_1():
    attn = make("dnas")
    x, pad = padded_batch(B=3, T=7)
    x = x * 4  # peaked scores: a softmax would starve some keys
    with torch.no_grad():
        _, w = attn(x, x, x, key_padding_mask=pad, need_head_weights=True)
    w = w.transpose(0, 1)
    for b in range(3):
        n = int((~pad[b]).sum())
        valid = w[b, :, :n, :n]
        assert torch.allclose(valid.sum(-1), torch.ones(H, n), atol=1e-5)
        # Lemma 1: every valid key receives total attention >= 1 / n_keys
        assert torch.all(valid.sum(dim=-2) >= 1.0 / n - 1e-6)


def test_dnas_gradients_are_finite_with_padding():
    attn = make("dnas").train()
    attn.dropout_module.p = 0.0
    x, pad = padded_batch()
    x.requires_grad_(True)
    out, _ = attn(x, x, x, key_padding_mask=pad, need_weights=False)
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_hnas_u_starts_at_one_half():
    attn = NormAttention(D, H, self_attention=True, attention_type="hnas")
    assert attn.hnas_u.item() == 0.5


def test_lp_normalize_has_unit_norm_in_half_precision():
    x = torch.randn(10, 8).to(torch.bfloat16) * 100
    y = lp_normalize(x, 3.5)
    assert y.dtype == torch.bfloat16
    norms = y.float().abs().pow(3.5).sum(-1).pow(1 / 3.5)
    assert torch.allclose(norms, torch.ones(10), atol=1e-2)


@pytest.mark.parametrize("p", [1.0, 1.5, 2.0, 3.0, 3.5, 4.0, 6.0, 8.0])
def test_lp_normalize_matches_the_definition_with_gradients(p):
    x = torch.randn(5, 3, 16, dtype=torch.float32) * 3
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    y = lp_normalize(x1, p)
    ref = x2 / x2.abs().pow(p).sum(-1, keepdim=True).pow(1 / p)  # the textbook formula
    assert torch.allclose(y, ref, atol=1e-6)
    w = torch.randn_like(y)
    (y * w).sum().backward()
    (ref * w).sum().backward()
    assert torch.allclose(x1.grad, x2.grad, atol=1e-5)


@pytest.mark.parametrize("p", [2.0, 3.5, 4.0, 8.0])
def test_lp_normalize_of_a_zero_vector_has_zero_output_and_finite_gradient(p):
    x = torch.randn(4, 8)
    x[1] = 0.0
    x.requires_grad_()
    y = lp_normalize(x, p)
    y.pow(2).sum().backward()
    assert torch.equal(y[1], torch.zeros(8))
    assert torch.isfinite(x.grad).all()


def test_dnas_needs_self_attention():
    with pytest.raises(ValueError, match="self-attention"):
        NormAttention(D, H, encoder_decoder_attention=True, attention_type="dnas")


def test_a_mask_is_unchanged_when_it_is_the_same_memory_unwritten_and_nothing_else():
    from qknorm_fairseq.attention import stamp, unchanged

    future = torch.triu(torch.full((6, 6), float("-inf")), 1)
    a = future[:4, :4]
    s = stamp(a)
    assert unchanged(s, a) and unchanged(s, future[:4, :4])  # fairseq's decoder slices anew for each layer
    assert unchanged(None, None) and not unchanged(s, None) and not unchanged(None, a)
    assert not unchanged(s, future[:3, :3]) and not unchanged(s, future[1:5, 1:5])
    assert not unchanged(s, a.clone())  # equal values, other memory: not known to stay equal
    assert not unchanged(s, a.t()) and not unchanged(s, a.to(torch.bfloat16))
    future[5, 0] = 1.0  # a write anywhere in the memory behind the view
    assert not unchanged(s, future[:4, :4]) and not unchanged(s, a)
    with torch.inference_mode():
        m = torch.zeros(3, 3)
    assert unchanged(stamp(m), m) and not unchanged(stamp(m), m[:, :])
