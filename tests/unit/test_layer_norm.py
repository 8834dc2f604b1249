"""--fused-kernels' LayerNorm on a CPU (csrc/layer_norm.c): alone against an fp64 computation, and with
--fast-dropout's residual dropout in the same pass against the unfused C loops, bit for bit."""
import copy

import pytest
import torch
import torch.nn.functional as F

from qknorm_fairseq import fused_kernels, native
from qknorm_fairseq.fast_dropout import FastDropout
from qknorm_fairseq.fused_kernels import RowsLayerNorm
from qknorm_fairseq.sublayers import residual_sublayers

from helpers import on_threads, torch_threads

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")

BITS = {torch.float32: torch.int32, torch.bfloat16: torch.int16}


def _inputs(shape, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    x, dy = (torch.randn(shape, generator=g).mul(2).add(0.5).to(dtype) for _ in range(2))
    w = (1 + 0.2 * torch.randn(shape[-1], generator=g)).to(dtype)
    b = (0.1 * torch.randn(shape[-1], generator=g)).to(dtype)
    return x, dy, w, b


def _grads(f, x, w, b, dy):
    x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
    y = f(x, w, b)
    y.backward(dy)
    return [t.detach() for t in (y, x.grad, w.grad, b.grad)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_is_the_fp32_formula_rounded_once_with_its_gradients(dtype):
    """Outputs and all three gradients against the same formula in fp64 (torch's layer_norm),
    within the rounding of DTYPE (bf16: 2^-8 relative; fp32: 1e-5), on one thread and on two, with
    the same bits on both (dw and db are summed in blocks of rows, not per thread)."""
    x, dy, w, b = _inputs((300, 200), dtype)
    ref = _grads(lambda x, w, b: F.layer_norm(x, (200,), w, b, 1e-5), *(t.double() for t in (x, w, b)), dy.double())
    runs = [on_threads(threads, _grads, lambda x, w, b: fused_kernels.layer_norm(x, w, b, 1e-5), x, w, b, dy)
            for threads in (1, 2)]
    tol = 2**-8 if dtype == torch.bfloat16 else 1e-5
    for ours, theirs in zip(runs[0], ref):
        assert ours.dtype == dtype
        assert (ours.double() - theirs).abs().max() <= tol * theirs.abs().max(), (ours - theirs).abs().max()
    for one, two in zip(*runs):
        assert torch.equal(one.view(BITS[dtype]), two.view(BITS[dtype]))


def test_layer_norm_outside_its_loops_is_torchs():
    """A transposed view, fp64 and mixed dtypes go to torch's layer_norm: the same values as it gives."""
    x, _, w, b = _inputs((40, 32), torch.float32)
    for a, wa, ba in ((x.t().contiguous().t(), w, b), (x.double(), w.double(), b.double()), (x, w.bfloat16(), b)):
        assert not fused_kernels.fits_layer_norm(a, wa, ba)
    assert fused_kernels.fits_layer_norm(x, w, b)
    t = x.t().contiguous().t()
    assert torch.equal(fused_kernels.layer_norm(t, w, b, 1e-5), F.layer_norm(t, (32,), w, b, 1e-5))


def test_rows_layer_norm_keeps_the_state_dict_and_evaluates_as_torchs():
    old = torch.nn.LayerNorm(16)
    with torch.no_grad():
        old.weight.uniform_(0.5, 1.5)
        old.bias.uniform_(-0.1, 0.1)
    new = RowsLayerNorm.swap(copy.deepcopy(old))
    assert type(new) is RowsLayerNorm and RowsLayerNorm.swap(torch.nn.Linear(2, 2)).__class__ is torch.nn.Linear
    assert new.state_dict().keys() == old.state_dict().keys()
    assert all(torch.equal(new.state_dict()[k], old.state_dict()[k]) for k in old.state_dict())
    x = torch.randn(8, 16)
    new.eval()
    assert torch.equal(new(x), old(x))
    new.train()
    assert torch.allclose(new(x), old(x), atol=1e-6)
    assert new(x.requires_grad_()).grad_fn.name() == "_LayerNormRowsBackward"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_add_norm_is_the_dropout_loop_then_the_norm_loop_bit_for_bit(dtype):
    """x = residual + dropout(y) and h = LayerNorm(x) in one pass, against --fast-dropout's C loop
    followed by the LayerNorm loop on the same seed: x, h and the gradients of y, the residual, the
    weight and the bias as the same bits, with the gradient of x from its other readers added in; on
    one thread and two (rows split across threads draw from their place in the stream)."""
    drop = FastDropout(0.3)
    norm = RowsLayerNorm(96)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.1, 0.1)
    drop.train(), norm.train()
    norm = norm.to(dtype)
    g = torch.Generator().manual_seed(1)
    y0, r0, gx, gh = (torch.randn(401, 96, generator=g).to(dtype) for _ in range(4))

    def run(fused):
        norm.zero_grad()
        y, r = y0.clone().requires_grad_(), r0.clone().requires_grad_()
        torch.manual_seed(7)
        x, h = norm.after_dropout(drop, y, r) if fused else (lambda x: (x, norm(x)))(drop.add(y, r))
        torch.autograd.backward((x, h), (gx, gh))
        return [t.detach().clone() for t in (x, h, y.grad, r.grad, norm.weight.grad, norm.bias.grad)]

    for threads in (1, 2):
        with torch_threads(threads):
            ours, theirs = run(True), run(False)
        for a, b in zip(ours, theirs):
            assert torch.equal(a.view(BITS[dtype]), b.view(BITS[dtype]))
    kept = (ours[2] != 0).float().mean()  # y's gradient is zero where its unit was dropped
    assert 0.66 < kept < 0.74, kept


def test_pre_norm_sublayers_fuse_the_residual_dropout_into_the_next_norm():
    """A pre-norm layer of two sublayers through residual_sublayers: with RowsLayerNorm and
    FastDropout the first residual dropout and the second norm run as one function, and the output
    and gradients are those of the same sublayers with the plain modules, on the same seed."""

    class Layer(torch.nn.Module):
        normalize_before = True

        def __init__(self, norm, dropout):
            super().__init__()
            self.norm1, self.norm2, self.dropout_module = norm(32), norm(32), dropout
            self.fc1, self.fc2 = torch.nn.Linear(32, 32), torch.nn.Linear(32, 32)

        def forward(self, x):
            return residual_sublayers(self, x, ((self.norm1, self.fc1), (self.norm2, self.fc2)))

    torch.manual_seed(0)
    plain = Layer(torch.nn.LayerNorm, FastDropout(0.2))
    fused = Layer(torch.nn.LayerNorm, FastDropout(0.2))
    fused.load_state_dict(plain.state_dict())
    RowsLayerNorm.swap(fused.norm1), RowsLayerNorm.swap(fused.norm2)
    x = torch.randn(64, 32)
    out = []
    for layer in (plain, fused):
        torch.manual_seed(3)
        xi = x.clone().requires_grad_()
        y = layer(xi)
        y.square().sum().backward()
        out.append((y.detach(), xi.grad, layer.fc1.weight.grad))
    assert any(n.name() == "_DropoutAddNormBackward" for n in _graph(fused(x.requires_grad_()).grad_fn))
    for a, b in zip(*out):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5)


def _graph(node, seen=None):
    seen = set() if seen is None else seen
    if node is not None and node not in seen:
        seen.add(node)
        yield node
        for child, _ in node.next_functions:
            yield from _graph(child, seen)
