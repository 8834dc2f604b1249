"""--fused-kernels (qknorm_fairseq/fused_kernels.py): the normalisation (on a CPU for p = 2 its C loops,
against the compiled loop too) against independent fp64 computations (the compiled loss:
tests/unit/test_criterion.py), the model's training step against the eager one, evaluation eager, and
the errors."""
import shutil

import pytest
import torch

from qknorm_fairseq import criterion, fast_dropout, fused_kernels, native

from helpers import batch, build, torch_threads

pytestmark = pytest.mark.skipif(not fused_kernels.has_compiler(),
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


def _normalised(x, dy, threads, c_loops):
    """lp_normalize(X, 2) and the gradient DY sends back, on THREADS threads, with or without the C loops."""
    with torch_threads(threads), native.enabled(c_loops):
        xc = x.detach().clone().requires_grad_()
        y = fused_kernels.lp_normalize(xc, 2.0, 1e-6)
        y.backward(dy)
    return y.detach(), xc.grad


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build csrc/l2_normalize.c")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_on_a_cpu_the_l2_normalisation_is_one_c_loop_each_way(dtype, monkeypatch):
    """p = 2 on dense rows (here a permuted view, as the encoder's heads) takes csrc/l2_normalize.c:
    against the compiled loop, values to one step of DTYPE's rounding and gradients to rtol 1e-5 (fp32)
    or one bf16 step; the same bits on 1 and 2 threads and with the upstream gradient in another layout."""
    torch.manual_seed(4)
    x = torch.randn(30, 40, 4, 64).to(dtype).permute(1, 2, 0, 3)
    x[0, 0, 0] = 0  # a row under the floor
    dy = torch.randn(x.shape).to(dtype)
    calls = []
    monkeypatch.setattr(fused_kernels._L2Rows, "apply", lambda *a, f=fused_kernels._L2Rows.apply: calls.append(1) or f(*a))
    one, two, compiled = _normalised(x, dy, 1, True), _normalised(x, dy, 2, True), _normalised(x, dy, 2, False)
    assert len(calls) == 2 and all(t.dtype == dtype and t.stride() == x.stride() for t in one + two)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert torch.equal(_normalised(x, dy.contiguous(), 2, True)[1], two[1])  # dy laid out unlike x
    step = 2 ** -8 if dtype == torch.bfloat16 else 1e-5
    for ours, theirs in zip(two, compiled):
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=step, atol=step * theirs.abs().max().item())


def test_rows_with_gaps_take_the_compiled_loop(monkeypatch):
    x = torch.randn(6, 3, 16)[..., ::2]  # the last dim strided
    monkeypatch.setattr(fused_kernels._L2Rows, "apply", lambda *a: pytest.fail("the C loop took rows with gaps"))
    y = fused_kernels.lp_normalize(x, 2.0, 1e-6)
    torch.testing.assert_close(y, x / x.norm(dim=-1, keepdim=True), rtol=1e-6, atol=1e-7)


def _masks(dtype):
    """The three additive masks attention passes: a key padding mask (3, 1, 1, 37); the causal mask as
    the packed decoder slices it from a larger one, (37, 37) with rows of 40; and their sum (3, 1, 37, 37)."""
    pad = torch.zeros(3, 37, dtype=torch.bool)
    pad[1, 30:], pad[2, 5:] = True, True
    pad = torch.zeros(pad.shape, dtype=dtype).masked_fill(pad, float("-inf"))[:, None, None, :]
    causal = torch.full((40, 40), float("-inf"), dtype=dtype).triu(1)[:37, :37]
    return [pad, causal, causal + pad]


def _softmax_dropout(scores, mask, p, grad, threads):
    with torch_threads(threads):
        x = scores.clone().requires_grad_()
        torch.manual_seed(11)
        state = torch.get_rng_state()
        y = fused_kernels.softmax_dropout(x, mask, p)
        y.backward(grad)
    return y.detach(), x.grad, torch.equal(torch.get_rng_state(), state)


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build csrc/softmax_dropout.c")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.0, 0.4])
def test_mask_softmax_and_dropout_in_one_c_loop(dtype, p):
    """Against fp64: softmax(scores + mask) times --fast-dropout's mask, drawn from the same seed (so the
    kept units are the unfused ops' own), to one step of DTYPE's rounding per rounding; the gradient to two,
    y (g m - sum(y g m)) in fp64. The same bits on 1 and 2 threads (the second thread's draws start
    inside a word, and past a refill of 1,024 draws); without dropout no draw from torch's generator."""
    torch.manual_seed(9)
    scores = (torch.randn(3, 4, 37, 37) * 4).to(dtype)
    grad = torch.randn(scores.shape).to(dtype)
    step = 2 ** -8 if dtype == torch.bfloat16 else 1e-6
    for mask in _masks(dtype):
        y, dx, no_draw = _softmax_dropout(scores, mask, p, grad, 2)
        assert no_draw == (p == 0)
        assert all(torch.equal(a, b) for a, b in zip((y, dx), _softmax_dropout(scores, mask, p, grad, 1)))
        probs = torch.softmax(scores.double() + mask.double(), dim=-1)
        torch.manual_seed(11)
        unfused = fast_dropout.fast_dropout(torch.softmax(scores + mask, dim=-1), p)
        torch.manual_seed(11)
        kept = fast_dropout.keep_mask(scores.shape, 1 - p, dtype).double() if p else torch.ones_like(probs)
        assert p == 0 or 0.5 < (kept != 0).double().mean() < 0.7
        # rounded twice with dropout: the probability (saved for the backward), then its product with the mask
        torch.testing.assert_close(y.double(), probs * kept, rtol=2 * step if p else step, atol=step / 100)
        gm = grad.double() * kept
        ref = probs * (gm - (probs * gm).sum(-1, keepdim=True))
        torch.testing.assert_close(dx.double(), ref, rtol=2 * step, atol=2 * step * ref.abs().max().item())
        if p:  # the units the unfused ops keep
            assert torch.equal(y != 0, unfused != 0)


def test_softmax_dropout_takes_only_what_its_loops_read():
    scores, mask = torch.randn(2, 3, 5, 7), torch.zeros(2, 1, 1, 7)
    assert fused_kernels.fits_softmax_dropout(scores, mask) == (native.compiler() is not None)
    assert not fused_kernels.fits_softmax_dropout(scores.transpose(-1, -2), mask)  # not contiguous
    assert not fused_kernels.fits_softmax_dropout(scores, mask.double())  # another dtype
    assert not fused_kernels.fits_softmax_dropout(scores.double(), mask.double())
    assert not fused_kernels.fits_softmax_dropout(scores[0], mask[0])  # three dims
    assert not fused_kernels.fits_softmax_dropout(scores, mask[..., :1])  # one value for every key


def _loss_and_grads(model, crit, sample):
    model.train()
    model.zero_grad()
    loss, _, _ = crit(model, sample)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("packed", [[], ["--packed-decoder"], ["--packed-decoder", "--attention-kernel", "matmul"]])
def test_the_flag_trains_as_the_eager_model(tiny_data, packed, monkeypatch):
    """The QKNorm preset with --fused-loss, no dropout: with the flag every normalisation and the loss
    run through the compiled loops (never the eager blocks), and with --attention-kernel matmul every
    attention's mask and softmax through softmax_dropout's, with the same loss and gradients (fp32
    rounding); evaluation and its validation loss stay eager, the outputs those of the model without it."""
    calls = {}

    def counted(name, fn):
        def wrapped(*args):
            calls[name] = calls.get(name, 0) + 1
            return fn(*args)
        return wrapped

    for name in ("lp_normalize", "l2_grids", "loss_statistics", "loss_gradient", "softmax_dropout"):
        monkeypatch.setattr(fused_kernels, name, counted(name, getattr(fused_kernels, name)))
    monkeypatch.setattr(criterion, "_blocked_statistics", counted("eager loss", criterion._blocked_statistics))
    extra = ["--task", "translation_qk", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
             "--word-dropout", "0", "--label-smoothing", "0.1", "--fused-loss", *packed]
    eager, task = build(tiny_data / "bin", "transformer_qknorm", *extra)
    fused, _ = build(tiny_data / "bin", "transformer_qknorm", *extra, "--fused-kernels")
    crit = task.build_criterion(eager.args)
    src, lengths, prev = batch(task)
    # targets among the types the vocabulary mask allows (the packed decoder's logits hold only those)
    allowed = eager.decoder.allowed_types.nonzero().squeeze(1)
    allowed = allowed[allowed >= task.target_dictionary.nspecial]
    target = allowed[torch.randint(len(allowed), prev.shape, generator=torch.Generator().manual_seed(0))]
    target[:, -1] = task.target_dictionary.eos()
    prev = torch.cat([target[:, -1:], target[:, :-1]], 1)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
              "target": target, "ntokens": target.numel()}
    ref_loss, ref_grads = _loss_and_grads(eager, crit, sample)
    assert calls == {"eager loss": 1}
    loss, grads = _loss_and_grads(fused, crit, sample)
    # q and k of 2 encoder self-attentions, 2 decoder self-attentions and 2 cross-attentions (the packed
    # decoder's queries and self-attention keys straight into its grids, by the C loop where it builds)
    # and with matmul the attention cores of the same 6 attentions, the packed decoder's per length group
    cores = {"softmax_dropout": calls.get("softmax_dropout", 0)} if "matmul" in packed else {}
    grids = {}
    if packed:  # called for those 6 either way; where the C loop does not build, lp_normalize then runs
        grids = {"l2_grids": 6, **({"lp_normalize": 6} if fused_kernels._library() is not None else {})}
    assert calls == {"eager loss": 1, "lp_normalize": 12, "loss_statistics": 1, "loss_gradient": 1, **cores, **grids}
    assert not cores or cores["softmax_dropout"] >= 6
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=0)
    for g, ref in zip(grads, ref_grads):  # fp32 rounding, grown through the layers (as test_compile's)
        torch.testing.assert_close(g, ref, rtol=1e-3, atol=1e-5)
    fused.eval(), eager.eval()
    with torch.no_grad():
        assert torch.equal(fused(src, lengths, prev)[0], eager(src, lengths, prev)[0])
        assert torch.equal(crit(fused, sample)[0], crit(eager, sample)[0])
    assert calls["lp_normalize"] == grids.get("lp_normalize", 12) and calls["loss_statistics"] == 1
    assert calls["eager loss"] == 3


def test_errors(tiny_data, monkeypatch):
    common = ["--task", "translation_qk", "--fused-kernels"]
    with pytest.raises(ValueError, match="--compile compiles each layer whole, --fused-kernels parts of them"):
        build(tiny_data / "bin", "transformer_qknorm", *common, "--compile")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    first_call = fused_kernels._compiled(lambda x: x + 1)
    with pytest.raises(ValueError, match=r"no C\+\+ compiler \(g\+\+, c\+\+, clang\+\+\) is on PATH: install one"):
        first_call(torch.ones(2))
    adam = fused_kernels._compiled(fused_kernels._adam_update, "--fused-adam")  # as fused_kernels.adam_update
    with pytest.raises(ValueError, match=r"^--fused-adam compiles C\+\+ loops .* or train without --fused-adam$"):
        adam(*[torch.ones(2)] * 6, 0.9, 0.98, 1e-8, 0.0)


_LOSS_STATISTICS = """
import torch
from qknorm_fairseq import fused_kernels
torch.manual_seed(0)
logits = (torch.randn(1472, 2350) * 3).bfloat16()[:1448]  # the packed decoder's rows: a view of more rows
target = torch.randint(0, 2350, (1448,))
with torch.no_grad():
    lse = fused_kernels._compiled_loss_statistics(logits, target, None)[0]  # Inductor's loops (a CPU's C loop is none)
print((lse - torch.logsumexp(logits.float(), -1)).abs().max().item())
"""


@pytest.mark.skipif("avx512f" not in native._cpu(), reason="needs a CPU with AVX-512: the hazard is code generated for "
                                                          "AVX2 loaded where vectors are wider")
def test_a_cache_shared_with_a_narrower_cpu_is_not_loaded(tmp_path):
    """Inductor's loops compiled for AVX2 (ATEN_CPU_CAPABILITY=avx2, as on another machine) into a shared cache
    directory, then run on this AVX-512 CPU from the same directory: the loss statistics are right. Without
    native.inductor_cache() torch 2.13 loads the AVX2 code here: wrong rows, then a heap corruption."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    for isa in ("avx2", None):
        run = subprocess.run([sys.executable, "-c", _LOSS_STATISTICS], capture_output=True, text=True,
                             env={**env, "ATEN_CPU_CAPABILITY": isa} if isa else env)
        assert run.returncode == 0, run.stderr[-2000:]
        assert float(run.stdout.split()[-1]) < 1e-5
    assert len(list(tmp_path.glob("cpu-*"))) == 2
