"""ScaleNorm, RMSNorm, l2_normalize, FixNorm and SmallInit against their definitions."""
import math

import pytest
import torch

from qknorm_fairseq import fixnorm
from qknorm_fairseq.fixnorm import FixNormEmbedding, FixNormOutputProjection, shared_fixnorm
from qknorm_fairseq.norms import RMSNorm, ScaleNorm, l2_normalize


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


@pytest.mark.parametrize("learnable", [True, False])
def test_scalenorm_repr_prints_g_without_autograd_warning(learnable, recwarn):
    # fairseq logs the model's repr at the start of every training run
    text = repr(ScaleNorm(16, learnable=learnable))
    assert f"g=4.000, learnable={learnable}" in text
    assert not [w for w in recwarn if "requires_grad" in str(w.message)]


def test_rmsnorm_definition():
    d = 32
    norm = RMSNorm(d)
    assert [p.numel() for p in norm.parameters()] == [d]
    norm.weight.data = torch.linspace(0.5, 2, d)
    x = torch.randn(4, d)
    rms = x.pow(2).mean(-1, keepdim=True).sqrt()
    assert torch.allclose(norm(x), norm.weight * x / rms, atol=1e-4)


def _reference_grads(module, formula, x, params):
    """Gradients of module(x) and of the textbook formula (plain autograd) for one random cotangent."""
    w = torch.randn(x.shape)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    (module(xa) * w).sum().backward()
    got = [xa.grad] + [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    (formula(xb) * w).sum().backward()
    return got, [xb.grad] + [p.grad for p in params]


def test_scalenorm_and_rmsnorm_backward_match_autograd_of_the_formula():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 2
    x[1, 2] = 0.0  # a clamped norm: the gradient is g/eps * dy there
    sn = ScaleNorm(16)
    sn.g.data.fill_(2.5)
    got, ref = _reference_grads(sn, lambda v: sn.g * v / v.norm(dim=-1, keepdim=True).clamp(min=sn.eps), x, [sn.g])
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-3 * b.abs().max().item()), (a - b).abs().max()
    rms = RMSNorm(16)
    rms.weight.data = torch.linspace(0.5, 2, 16)
    formula = lambda v: rms.weight * v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + rms.eps)  # noqa: E731
    got, ref = _reference_grads(rms, formula, x, [rms.weight])
    for a, b in zip(got, ref):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)


def test_norm_functions_pass_gradcheck():
    from qknorm_fairseq.norms import _RMSNormFunction, _ScaleNormFunction
    x = torch.randn(4, 6, dtype=torch.double, requires_grad=True)
    g = torch.tensor(2.0, dtype=torch.double, requires_grad=True)
    w = torch.rand(6, dtype=torch.double, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: _ScaleNormFunction.apply(a, b, 1e-5), (x, g))
    assert torch.autograd.gradcheck(lambda a, b: _RMSNormFunction.apply(a, b, 1e-6), (x, w))


def _bits(t):
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
                   torch.float64: torch.int64}[t.dtype])


def _cases(dtype):
    """Inputs with every branch of the formula: ordinary rows over three orders of magnitude, an
    all-zero row and a row under eps (clamped norms), and a gradient with an all-zero row (a padded
    key's)."""
    gen = torch.Generator().manual_seed(0)
    for scale in (1e-2, 1.0, 1e2):
        for shape in ((2, 3, 7, 64), (40, 256)):
            x = (torch.randn(shape, generator=gen) * scale).to(dtype)
            x[0, 0] = 0.0
            x[1, 0] = 1e-8
            dy = torch.randn(shape, generator=gen).to(dtype)
            dy[0, 1] = 0.0
            yield x, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_l2_normalize_is_autograds_plain_ops_to_the_bit(dtype):
    """The hand-written backward rounds as autograd does through the plain ops (QKNorm's before it):
    outputs and gradients are the same bits, so no result of the project changes."""
    eps = 1e-6
    for x, dy in _cases(dtype):
        a, b = x.clone().requires_grad_(), x.clone().requires_grad_()
        y = l2_normalize(a, eps)
        dtype32 = torch.float64 if dtype == torch.float64 else torch.float32
        plain = (b / torch.linalg.vector_norm(b, dim=-1, keepdim=True, dtype=dtype32).clamp(min=eps)).to(dtype)
        assert y.dtype == dtype and torch.equal(_bits(y), _bits(plain))
        y.backward(dy)
        plain.backward(dy)
        assert a.grad.dtype == dtype and torch.equal(_bits(a.grad), _bits(b.grad))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fixnorm_normalisation_is_f_normalize_to_the_bit(dtype):
    for w, dy in _cases(dtype):
        a, b = w.clone().requires_grad_(), w.clone().requires_grad_()
        y, ref = fixnorm._normalize(a), torch.nn.functional.normalize(b.float(), dim=-1).type_as(b)
        assert y.dtype == dtype and torch.equal(_bits(y), _bits(ref))
        y.backward(dy)
        ref.backward(dy)
        assert torch.equal(_bits(a.grad), _bits(b.grad))


def test_l2_normalize_gradient_is_the_formulas():
    torch.manual_seed(0)
    x = torch.randn(3, 5, 16) * 3
    x[1, 2] = 0.0  # a clamped norm: the gradient is dy/eps there
    eps = 1e-6
    a = x.clone().requires_grad_()
    dy = torch.randn(x.shape)
    l2_normalize(a, eps).backward(dy)
    # against autograd of the textbook formula in fp64
    xd = x.double().requires_grad_()
    (xd / xd.norm(dim=-1, keepdim=True).clamp(min=eps) * dy.double()).sum().backward()
    assert torch.allclose(a.grad.double(), xd.grad, rtol=1e-5, atol=1e-5 * xd.grad.abs().max().item())
    assert torch.allclose(a.grad[1, 2], dy[1, 2] / eps)


def test_l2_normalize_passes_gradcheck():
    x = torch.randn(4, 6, dtype=torch.double)
    x[2] = 0.0
    assert torch.autograd.gradcheck(lambda a: l2_normalize(a, 1e-6), (x.requires_grad_(),))


def test_l2_normalize_backward_takes_fewer_ops_than_autograds():
    """One normalisation's backward of an fp32 (bf16) q: 11 (12) ATen ops, the
    engine's detaches included, against autograd's 16 (19) through the plain ops."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    def backward_ops(fn, dtype):
        x = torch.randn(2, 4, 8).to(dtype).requires_grad_()
        y = fn(x)
        dy = torch.ones_like(y)
        Count.n = 0
        with Count():
            y.backward(dy)
        return Count.n

    def plain(x):
        return (x / torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=torch.float32).clamp(min=1e-6)).to(x.dtype)

    counts = {dtype: (backward_ops(lambda x: l2_normalize(x, 1e-6), dtype), backward_ops(plain, dtype))
              for dtype in (torch.float32, torch.bfloat16)}
    for dtype, (ours, autograds) in counts.items():
        # both counted here, the counts of norms.py's docstring as a bound: a torch that adds ops
        # to autograd's side alone does not fail this
        assert ours < autograds and ours <= {torch.float32: 11, torch.bfloat16: 12}[dtype], counts


def test_scalenorm_fixed_g_gets_no_gradient_and_keeps_bf16():
    norm = ScaleNorm(8, learnable=False)
    x = torch.randn(2, 8, dtype=torch.bfloat16, requires_grad=True)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    y.float().sum().backward()
    assert x.grad is not None and norm.g.grad is None


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fixnorm_embedding_in_half_precision_keeps_padding_zero_and_rows_unit(dtype):
    # fairseq's --fp16 keeps the weights in half: F.normalize's eps underflowed to 0 there and the
    # all-zero padding row became 0/0 = NaN, which stopped every FixNorm preset at its first step.
    torch.manual_seed(0)
    emb = FixNormEmbedding(50, 16, padding_idx=1)
    ref = emb(torch.tensor([[0, 1, 7]]))
    emb = emb.to(dtype)
    for mode in (True, False):
        out = emb.train(mode)(torch.tensor([[0, 1, 7]]))
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert out[0, 1].abs().sum() == 0
        assert torch.allclose(out.float(), ref, atol=1e-2)


def test_fixnorm_cache_follows_weight_updates():
    emb = FixNormEmbedding(10, 8, padding_idx=1).eval()
    with torch.no_grad():
        before = emb(torch.tensor([3])).clone()
        emb.weight[3] = torch.arange(8.0)
        after = emb(torch.tensor([3]))
    assert not torch.allclose(before, after)
    assert torch.allclose(after, torch.arange(8.0) / torch.arange(8.0).norm())


def test_fixnorm_shared_normalization_gives_the_same_gradients_with_one_normalization(monkeypatch):
    torch.manual_seed(0)
    emb = FixNormEmbedding(20, 8, padding_idx=1).train()
    proj = FixNormOutputProjection(emb)
    tokens, target = torch.tensor([[2, 5, 7]]), torch.tensor([3, 9, 4])

    def step():
        emb.zero_grad()
        logits = proj(emb(tokens) + emb(tokens.flip(-1)))  # three uses, as source, target and output
        torch.nn.functional.cross_entropy(logits[0], target).backward()
        return logits.detach(), emb.weight.grad.clone()

    calls = []
    real = fixnorm.l2_normalize
    monkeypatch.setattr(fixnorm, "l2_normalize", lambda *a, **k: calls.append(1) or real(*a, **k))
    plain = step()
    assert len(calls) == 3
    calls.clear()
    with shared_fixnorm(emb, emb, torch.nn.Linear(2, 2)):
        shared = step()
    assert len(calls) == 1
    assert torch.allclose(plain[0], shared[0]) and torch.allclose(plain[1], shared[1], atol=1e-7)
    calls.clear()
    step()  # outside the context nothing stale is reused
    assert len(calls) == 3 and emb._shared is None


def test_fixnorm_cache_sees_optimizer_updates_through_data():
    # fairseq's optimizers update parameters with p.data.copy_(...), invisible to the version
    # counter; validation then runs after model.eval(). A stale cache made every validation of
    # a FixNorm model decode with the embeddings of the first one.
    emb = FixNormEmbedding(10, 8, padding_idx=1)
    tokens = torch.tensor([3])
    emb.eval()
    with torch.no_grad():
        first = emb(tokens).clone()
    emb.train()
    emb.weight.data.copy_(torch.randn(10, 8))
    emb.eval()
    with torch.no_grad():
        second = emb(tokens)
    assert torch.allclose(second, emb.weight[3].detach() / emb.weight[3].detach().norm())
    assert not torch.allclose(first, second)
