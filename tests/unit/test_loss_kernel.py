"""--fused-loss under --fused-kernels on a CPU (csrc/loss.c): the loss's statistics and gradient against the same
formulas in fp64, the same bits on one thread and two, Inductor's loops left for what the C loops do not take, and
the criterion's loss and gradient through them."""
import pytest
import torch

from qknorm_fairseq import fused_kernels, native
from qknorm_fairseq.criterion import FusedLabelSmoothedNLL, masked_label_smoothed_nll_loss

from helpers import on_threads

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")


def _case(dtype, masked, rows=203, types=1031, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(rows, types, generator=g) * 4 - 3).to(dtype)
    forbidden = None
    if masked:
        forbidden = torch.rand(types, generator=g) < 0.2
        logits[:, forbidden] = float("-inf")
    allowed = torch.ones(types, dtype=torch.bool) if forbidden is None else ~forbidden
    target = torch.multinomial(allowed.double(), rows, replacement=True, generator=g)
    return logits, target, forbidden


def _counting(monkeypatch):
    calls = []
    original = fused_kernels.loss_kernel
    monkeypatch.setattr(fused_kernels, "loss_kernel", lambda name, *args: calls.append(name) or original(name, *args))
    return calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_the_statistics_and_gradient_are_the_formulas_in_fp64(monkeypatch, dtype, masked):
    """logsumexp, the target's logit and the allowed logits' sum to fp32 rounding (the sum relative to the sum of
    magnitudes); the gradient to fp32's rounding, or one bf16 step; 1 and 2 threads the same bits (rows of 1,031
    types: 64 vectors of 16 lanes and a tail of 7)."""
    calls = _counting(monkeypatch)
    logits, target, forbidden = _case(dtype, masked)
    x = logits.double()
    allowed = torch.ones(x.size(1), dtype=torch.bool) if forbidden is None else ~forbidden
    ref = (torch.logsumexp(x, -1), x.gather(-1, target[:, None]).squeeze(-1), x.masked_fill(~allowed, 0).sum(-1))
    stats = [on_threads(t, fused_kernels.loss_statistics, logits, target, forbidden) for t in (1, 2)]
    for a, b in zip(*stats):
        assert a.dtype == torch.float32 and torch.equal(a, b)
    lse, tgt, total = stats[0]
    assert torch.allclose(lse.double(), ref[0], rtol=0, atol=2e-6 * ref[0].abs().max().item())
    assert torch.equal(tgt.double(), ref[1])
    assert torch.all((total.double() - ref[2]).abs() <= 1e-6 * x.masked_fill(~allowed, 0).abs().sum(-1))

    g = torch.Generator().manual_seed(1)
    c_softmax, c_nll, c_smooth = torch.rand(3, x.size(0), generator=g)
    c_smooth *= 0.01
    weights = None if forbidden is None else allowed.float()
    grads = [on_threads(t, fused_kernels.loss_gradient, logits, lse, c_softmax, target, c_nll, c_smooth, weights)
             for t in (1, 2)]
    assert grads[0].dtype == dtype and torch.equal(grads[0], grads[1])
    expected = torch.exp(x - lse.double()[:, None]) * c_softmax.double()[:, None]
    expected[torch.arange(x.size(0)), target] -= c_nll.double()
    expected -= c_smooth.double()[:, None] * allowed.double()
    if dtype == torch.bfloat16:
        assert torch.allclose(grads[0].double(), expected, rtol=2 ** -8, atol=1e-7)
    else:
        assert torch.allclose(grads[0].double(), expected, rtol=1e-5, atol=1e-7)
    if masked:
        assert not grads[0][:, forbidden].any(), "a forbidden type gets no gradient"
    assert calls == ["qk_loss_statistics"] * 2 + ["qk_loss_gradient"] * 2


def test_rows_of_every_kind_of_logit_give_logsumexps_as_torchs():
    """A row of -inf but one type, one all -inf, one with +inf, one with a NaN: torch's logsumexp of each."""
    logits = torch.randn(4, 40)
    logits[0, 1:] = float("-inf")
    logits[1] = float("-inf")
    logits[2, 7] = float("inf")
    logits[3, 5] = float("nan")
    lse = fused_kernels.loss_statistics(logits, torch.zeros(4, dtype=torch.int64), None)[0]
    assert torch.allclose(lse, torch.logsumexp(logits, -1), equal_nan=True)


def test_a_target_outside_the_logits_is_a_one_line_error():
    logits, target, _ = _case(torch.float32, False, rows=8, types=50)
    target[3] = 50
    with pytest.raises(ValueError, match=r"^--fused-loss: 1 targets lie outside the logits' 50 types: the targets "
                                         r"and the output layer come from different dictionaries$"):
        fused_kernels.loss_statistics(logits, target, None)


def test_what_the_c_loops_do_not_take_runs_in_inductors_loops(monkeypatch):
    """fp64 logits (gradcheck's), a non-contiguous view, or the C kernels switched off: the compiled loops."""
    calls = _counting(monkeypatch)
    compiled = []
    monkeypatch.setattr(fused_kernels, "_compiled_loss_statistics", lambda *a: compiled.append(a[0].dtype) or (None,) * 3)
    logits, target, _ = _case(torch.float32, False, rows=8, types=50)
    fused_kernels.loss_statistics(logits.double(), target, None)
    fused_kernels.loss_statistics(logits.t().contiguous().t(), target, None)
    with native.enabled(False):
        fused_kernels.loss_statistics(logits, target, None)
    assert calls == [] and compiled == [torch.float64, torch.float32, torch.float32]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_criterions_loss_and_gradient_through_the_c_loops(monkeypatch, dtype):
    """FusedLabelSmoothedNLL with --fused-kernels on masked fp32 or bf16 logits, padding rows and a target the mask
    forbids: the loss of log_softmax in fp64 to fp32 rounding, the gradient of loss + 0.3 nll to the logits' rounding."""
    calls = _counting(monkeypatch)
    logits, target, forbidden = _case(dtype, True, rows=120, types=300, seed=3)
    allowed = ~forbidden
    target[:5] = 1  # padding
    target[9] = int(forbidden.nonzero()[0])  # its nll clamped, no gradient through it
    allowed[1] = True
    logits[:, 1] = 0.5
    out = []
    for fused in (True, False):
        x = logits.detach().clone().requires_grad_()
        if fused:
            loss, nll = FusedLabelSmoothedNLL.apply(x, target, 0.1, 1, allowed, False, True)
        else:
            loss, nll = masked_label_smoothed_nll_loss(torch.log_softmax(x.double(), -1), target, 0.1, ignore_index=1,
                                                       allowed=allowed)
        (loss + 0.3 * nll).backward()
        out.append((loss.detach().double(), nll.detach().double(), x.grad.double()))
    (loss, nll, grad), (ref_loss, ref_nll, ref_grad) = out
    assert torch.allclose(loss, ref_loss, rtol=1e-6) and torch.allclose(nll, ref_nll, rtol=1e-6)
    rtol = 2 ** -8 if dtype == torch.bfloat16 else 1e-5
    assert torch.allclose(grad, ref_grad, rtol=rtol, atol=1e-6)
    assert not grad[:5].any(), "padding rows get no gradient"
    assert calls == ["qk_loss_statistics", "qk_loss_gradient"]
