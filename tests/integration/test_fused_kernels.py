"""--fused-kernels (qknorm_fairseq/fused_kernels.py): the compiled normalisation against independent
fp64 computations (the compiled loss: tests/unit/test_criterion.py), the model's training step
against the eager one, evaluation eager, and the errors."""
import shutil

import pytest
import torch
from torch._dynamo.utils import counters

from qknorm_fairseq import fused_kernels

from helpers import batch, build

pytestmark = pytest.mark.skipif(not any(map(shutil.which, fused_kernels.COMPILERS)),
                                reason="no C++ compiler on PATH: torch.compile cannot build the CPU kernels")


def test_l2_normalisation_and_its_gradient():
    """fp32 queries (a permuted view, as attention passes them, and a zero vector): x / max(||x||, eps)
    and its gradient in closed form, (dy - y (y . dy)) / ||x||, and dy / eps where the norm is under
    eps, both in fp64, to fp32 rounding."""
    torch.manual_seed(0)
    x = torch.randn(5, 7, 2, 8).permute(0, 2, 1, 3)
    x[0, 0, 0] = 0
    dy = torch.randn(x.shape)
    xc = x.clone().requires_grad_()
    y = fused_kernels.lp_normalize(xc, 2.0, 1e-6)
    y.backward(dy)
    xd, dyd = x.double(), dy.double()
    norm = (xd * xd).sum(-1, keepdim=True).sqrt()
    ref = xd / norm.clamp(min=1e-6)
    ref_grad = torch.where(norm < 1e-6, dyd / 1e-6, (dyd - ref * (ref * dyd).sum(-1, keepdim=True)) / norm)
    assert y.dtype == torch.float32 and not y[0, 0, 0].any()
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(xc.grad.double(), ref_grad, rtol=1e-5, atol=1e-6)


def test_lp_normalisation_is_autograd_of_the_formula():
    """p = 3.5: values and gradients of autograd through x / ||x||_p in fp64, to fp32 rounding."""
    torch.manual_seed(3)
    x, dy = torch.randn(6, 3, 8), torch.randn(6, 3, 8)
    xc, xr = x.clone().requires_grad_(), x.double().requires_grad_()
    y = fused_kernels.lp_normalize(xc, 3.5, 1e-6)
    y.backward(dy)
    ref = xr / xr.abs().pow(3.5).sum(-1, keepdim=True).pow(1 / 3.5)
    ref.backward(dy.double())
    torch.testing.assert_close(y.double(), ref, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(xc.grad.double(), xr.grad, rtol=1e-5, atol=1e-6)


def test_bf16_normalisation_rounds_once():
    """bf16 keys: the fp64 value rounded to bf16, to one bf16 step (fp32 rounding may sit on a tie)."""
    torch.manual_seed(1)
    x = torch.randn(300, 4, 64).bfloat16()
    y = fused_kernels.lp_normalize(x, 2.0, 1e-6)
    assert y.dtype == torch.bfloat16
    xd = x.double()
    torch.testing.assert_close(y.double(), xd / (xd * xd).sum(-1, keepdim=True).sqrt(), rtol=2 ** -8, atol=0)


def _loss_and_grads(model, task, sample):
    crit = task.build_criterion(model.args)
    model.train()
    model.zero_grad()
    loss, _, _ = crit(model, sample)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("packed", [[], ["--packed-decoder"]])
def test_the_flag_trains_as_the_eager_model(tiny_data, packed):
    """The QKNorm preset with --fused-loss, no dropout: the same loss and gradients with and without
    the flag (fp32 rounding), compiled code really run; evaluation is the eager model's, bit for bit."""
    extra = ["--task", "translation_qk", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
             "--word-dropout", "0", "--label-smoothing", "0.1", "--fused-loss", *packed]
    eager, task = build(tiny_data / "bin", "transformer_qknorm", *extra)
    fused, _ = build(tiny_data / "bin", "transformer_qknorm", *extra, "--fused-kernels")
    src, lengths, prev = batch(task)
    # targets among the types the vocabulary mask allows (the packed decoder's logits hold only those)
    allowed = eager.decoder.allowed_types.nonzero().squeeze(1)
    allowed = allowed[allowed >= task.target_dictionary.nspecial]
    target = allowed[torch.randint(len(allowed), prev.shape, generator=torch.Generator().manual_seed(0))]
    target[:, -1] = task.target_dictionary.eos()
    prev = torch.cat([target[:, -1:], target[:, :-1]], 1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": target, "ntokens": target.numel()}
    counters.clear()
    ref_loss, ref_grads = _loss_and_grads(eager, task, sample)
    assert counters["stats"]["unique_graphs"] == 0
    loss, grads = _loss_and_grads(fused, task, sample)
    assert counters["stats"]["unique_graphs"] > 0  # the flag's compiled loops ran
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for g, ref in zip(grads, ref_grads):  # fp32 rounding, grown through the layers (as test_compile's)
        torch.testing.assert_close(g, ref, rtol=1e-3, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        assert torch.equal(fused.eval()(src, lengths, prev)[0], eager.eval()(src, lengths, prev)[0])
    assert counters["stats"]["unique_graphs"] == graphs  # evaluation compiled nothing


def test_errors(tiny_data, monkeypatch):
    common = ["--task", "translation_qk", "--fused-kernels"]
    with pytest.raises(ValueError, match="--fused-kernels has no effect without a QKNorm attention .* or --fused-loss"):
        build(tiny_data / "bin", "transformer_prenorm", *common)
    with pytest.raises(ValueError, match="--compile compiles each layer whole, --fused-kernels parts of them"):
        build(tiny_data / "bin", "transformer_qknorm", *common, "--compile")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    first_call = fused_kernels._compiled(lambda x: x + 1)
    with pytest.raises(RuntimeError, match=r"no C\+\+ compiler \(g\+\+, c\+\+, clang\+\+\) is on PATH: install one"):
        first_call(torch.ones(2))
