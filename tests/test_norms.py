"""ScaleNorm, RMSNorm, FixNorm and SmallInit against their definitions."""
import math

import torch

from qknorm_fairseq.attention import NormAttention, init_small
from qknorm_fairseq.embeddings import FixNormEmbedding, FixNormOutputProjection
from qknorm_fairseq.norms import RMSNorm, ScaleNorm, build_norm


def test_scalenorm_definition():
    d = 64
    norm = ScaleNorm(d)
    assert [p.numel() for p in norm.parameters()] == [1]
    assert math.isclose(norm.g.item(), math.sqrt(d), rel_tol=1e-6)
    x = torch.randn(5, d) * 3
    y = norm(x)
    # g * x / ||x||: every output vector has norm g and the direction of x
    assert torch.allclose(y.norm(dim=-1), torch.full((5,), math.sqrt(d)), rtol=1e-5)
    assert torch.allclose(y, math.sqrt(d) * x / x.norm(dim=-1, keepdim=True), atol=1e-5)
    assert torch.all(norm(torch.zeros(2, d)) == 0), "eps keeps the zero vector finite"


def test_scalenorm_fixed_g_is_not_a_parameter():
    norm = ScaleNorm(16, learnable=False)
    assert list(norm.parameters()) == []
    assert "g" in norm.state_dict()


def test_rmsnorm_definition():
    d = 32
    norm = RMSNorm(d)
    assert [p.numel() for p in norm.parameters()] == [d]
    norm.weight.data = torch.linspace(0.5, 2, d)
    x = torch.randn(4, d)
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    assert torch.allclose(norm(x), norm.weight * x / rms, atol=1e-4)


def test_build_norm_rejects_unknown_type():
    try:
        build_norm("batchnorm", 8)
    except ValueError as e:
        assert "layernorm, scalenorm, rmsnorm" in str(e)
    else:
        raise AssertionError("no error")


def test_fixnorm_embedding():
    torch.manual_seed(0)
    emb = FixNormEmbedding(500, 64, padding_idx=1)
    w = emb.weight.detach()
    assert w.abs().max() <= 0.01 and w[1].abs().sum() == 0
    assert abs(w.std().item() - 0.02 / math.sqrt(12)) < 5e-4  # U(-0.01, 0.01)
    out = emb(torch.tensor([[0, 1, 7, 499]]))
    assert torch.allclose(out[0, [0, 2, 3]].norm(dim=-1), torch.ones(3), atol=1e-5)
    assert out[0, 1].abs().sum() == 0, "padding stays zero"
    proj = FixNormOutputProjection(emb)
    h = torch.randn(3, 64)
    cos = torch.nn.functional.cosine_similarity(h[:, None, :], w[None], dim=-1) * h.norm(dim=-1, keepdim=True)
    keep = torch.arange(500) != 1
    assert torch.allclose(proj(h)[:, keep], cos[:, keep], atol=1e-5)
    assert sum(p.numel() for p in proj.parameters()) == 500 * 64, "tied: no second copy"


def test_fixnorm_cache_follows_weight_updates():
    emb = FixNormEmbedding(10, 8, padding_idx=1).eval()
    with torch.no_grad():
        before = emb(torch.tensor([3])).clone()
        emb.weight[3] = torch.arange(8.0)
        after = emb(torch.tensor([3]))
    assert not torch.allclose(before, after)
    assert torch.allclose(after, torch.arange(8.0) / torch.arange(8.0).norm())


def test_smallinit_statistics():
    torch.manual_seed(0)
    d = 512
    attn = NormAttention(d, 8, self_attention=True)
    init_small(attn, d)
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        assert abs(proj.weight.std().item() / math.sqrt(2 / (5 * d)) - 1) < 0.02
        assert abs(proj.weight.mean().item()) < 1e-3
        assert proj.bias.abs().sum() == 0
