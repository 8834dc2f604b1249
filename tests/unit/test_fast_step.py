"""The leaner training step: each change against fairseq's own computation, bit for bit
in fp32, and the fast paths (flat bf16 master, --fast-dropout, --length-buckets) against what they
replace."""
import logging

import numpy as np
import pytest
import torch
from fairseq import utils
from fairseq.models.transformer import TransformerEncoderBase
from omegaconf import OmegaConf

from qknorm_fairseq import fused_kernels, native, optimizer
from qknorm_fairseq.criterion import masked_label_smoothed_nll_loss
from qknorm_fairseq.fast_dropout import FastDropout, fast_dropout, keep_mask, uniform_int16
from qknorm_fairseq.length_buckets import LengthBucketDataset, bucket_batches, bucket_bounds
from qknorm_fairseq.optimizer import FairseqMultiTensorAdam, MultiTensorAdam
from qknorm_fairseq.trainer import FlatBF16Optimizer

from helpers import batch, build


def _cfg(optimizer="multi_tensor_adam", lr=1e-2, fused_adam=False):
    return OmegaConf.create({
        "common": {"bf16": True, "fp16_no_flatten_grads": False, "fp16_scale_window": None, "tpu": False,
                   "model_parallel_size": 1},
        "optimization": {"update_freq": [1], "lr": [lr]},
        "distributed_training": {"distributed_world_size": 1},
        "optimizer": {"_name": optimizer, "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8, "weight_decay": 0.0,
                      "lr": [lr], **({"fused_adam": True} if fused_adam else {})}})


def _params(seed):
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    return [torch.nn.Parameter(torch.randn(s, generator=g).bfloat16()) for s in shapes]


@pytest.mark.parametrize("fused", [None, "compiled", "C"], ids=["multi-tensor", "fused-adam compiled", "fused-adam C loop"])
def test_flat_bf16_master_steps_as_fairseqs_per_parameter_masters(fused, monkeypatch):
    """fairseq's FP16Optimizer under --bf16 (one fp32 copy per parameter, its adam) and ours (one flat
    fp32 tensor, multi_tensor_adam; with --fused-adam the clipping factor goes to its compiled step
    instead of into the gradients, or on a CPU to its C loop, which reads the bf16 gradients and writes
    the bf16 weights itself): the same bf16 weights and fp32 masters after clipped steps."""
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    if fused == "compiled" and not fused_kernels.has_compiler():
        pytest.skip("no C++ compiler on PATH: torch.compile cannot build the CPU kernels")
    if fused == "C" and native.compiler() is None:
        pytest.skip("no C compiler on PATH to build csrc/flat_adam.c")
    if fused == "compiled":
        monkeypatch.setattr(FlatBF16Optimizer, "_native", lambda self: None)
        monkeypatch.setattr(MultiTensorAdam, "c_steps", lambda self, params: False)
    c_steps, c_step = [], MultiTensorAdam.flat_bf16_step
    monkeypatch.setattr(MultiTensorAdam, "flat_bf16_step", lambda self, *a: c_steps.append(a) or c_step(self, *a))
    ref_params, flat_params = _params(0), _params(0)
    ref = FP16Optimizer.build_optimizer(_cfg("adam"), ref_params)
    flat = FlatBF16Optimizer.build_optimizer(_cfg(fused_adam=bool(fused)), flat_params)
    assert flat.supports_step_with_scale == bool(fused)
    assert flat.fp32_params.numel() == sum(p.numel() for p in flat_params) and flat.fp32_params.dtype == torch.float32
    for step in range(3):
        g = torch.Generator().manual_seed(10 + step)
        grads = [torch.randn(p.shape, generator=g).bfloat16() for p in ref_params]
        norms = []
        for opt, params in ((ref, ref_params), (flat, flat_params)):
            opt.zero_grad()
            for p, gr in zip(params, grads):
                p.grad = gr.clone()
            opt._needs_sync = True  # as opt.backward(loss) leaves it
            opt.multiply_grads(0.5)
            norms.append(opt.clip_grad_norm(1.0))
            opt.step()
        # the norm of one flat tensor and fairseq's norm of per-parameter norms differ in rounding only
        assert norms[0] > 1 and torch.allclose(norms[0], norms[1], rtol=1e-6)
    assert len(c_steps) == (3 if fused == "C" else 0)
    ref32 = torch.cat([p.reshape(-1) for p in ref.fp32_params])
    assert torch.allclose(ref32, flat.fp32_params.data, rtol=1e-6, atol=1e-7)
    for p, q, master in zip(ref_params, flat_params, flat._master):
        assert q.dtype == torch.bfloat16 and torch.equal(q, master.bfloat16())  # the masters written back
        assert torch.allclose(p.float(), q.float(), rtol=1e-2)


def test_without_a_compiler_fused_adam_steps_through_its_compiled_loop_with_a_warning(tmp_path, monkeypatch, caplog):
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    monkeypatch.setenv("CC", "no-such-compiler-qk")
    monkeypatch.setenv("QKNORM_CACHE", str(tmp_path))
    native.forget()
    params = _params(0)
    flat = FlatBF16Optimizer.build_optimizer(_cfg(fused_adam=True), params)
    for p in params:
        p.grad = torch.ones_like(p)
    flat._needs_sync = True
    with caplog.at_level(logging.WARNING, logger="qknorm_fairseq.native"):
        assert flat._native() is None
        monkeypatch.setattr(FP16Optimizer, "clip_grad_norm", lambda self, *a: "fairseq's clip")
        assert flat.clip_grad_norm(1.0) == "fairseq's clip"
    assert optimizer.adam_library() is None
    assert [r.message for r in caplog.records] == [
        "--fused-adam: no C compiler ($CC or cc, gcc, clang) on PATH to build flat_adam.c; every tensor steps "
        "through the compiled loop (under --bf16 with fairseq's copies) instead (docs/performance.md)"]
    native.forget()


def test_multi_tensor_clip_is_fairseqs_clip_bit_for_bit():
    params = [torch.nn.Parameter(torch.zeros(s)) for s in ((40, 30), (30,), (9, 9))]
    ref = [torch.nn.Parameter(torch.zeros(s)) for s in ((40, 30), (30,), (9, 9))]
    g = torch.Generator().manual_seed(3)
    for p, q in zip(params, ref):
        p.grad = torch.randn(p.shape, generator=g) * 3
        q.grad = p.grad.clone()
    opt = FairseqMultiTensorAdam(OmegaConf.create(_cfg().optimizer), params)
    ours = opt.clip_grad_norm(1.0)
    theirs = utils.clip_grad_norm_(ref, 1.0)
    assert torch.equal(ours, theirs) and ours > 1
    assert all(torch.equal(p.grad, q.grad) for p, q in zip(params, ref))


def test_fast_dropout_keeps_one_minus_p_scaled_and_backpropagates_through_the_same_mask():
    torch.manual_seed(0)
    x = torch.ones(400, 500, requires_grad=True)
    y = fast_dropout(x, 0.4)
    kept = (y != 0).float().mean().item()
    # binomial sd of the kept share over 200,000 units: 0.0011
    assert abs(kept - 0.6) < 0.006, kept
    assert torch.allclose(y[y != 0], torch.tensor(1 / 0.6))
    y.sum().backward()
    assert torch.equal(x.grad, y.detach())  # d(sum)/dx = the mask itself
    assert fast_dropout(x, 0.4, training=False) is x and fast_dropout(x, 0.0) is x
    assert not fast_dropout(x, 1.0).any()
    m = keep_mask((1000, 1000), 0.9, torch.bfloat16)
    assert m.dtype == torch.bfloat16 and abs((m > 0).float().mean().item() - 0.9) < 0.003
    # p below 2^-17 rounds KEEP to 1 at the draws' 16 bits: every unit kept (int16 draws have no 32768 to compare
    # with), the draws taken all the same, so the stream goes on as the C loops leave it
    torch.manual_seed(1)
    tiny = keep_mask((300, 7), 1 - 1e-6, torch.float32)
    assert torch.equal(tiny, torch.full((300, 7), 1 / (1 - 1e-6)))
    after = uniform_int16(5)
    torch.manual_seed(1)
    uniform_int16(300 * 7)
    assert torch.equal(after, uniform_int16(5))


def test_fast_dropout_draws_are_uniform_independent_and_follow_torch_manual_seed():
    torch.manual_seed(3)
    draws = uniform_int16(1 << 20)
    again = uniform_int16(1 << 20)
    torch.manual_seed(3)
    assert torch.equal(uniform_int16(1 << 20), draws)  # fairseq reseeds torch at every update
    assert not torch.equal(draws, again)
    assert draws.dtype == torch.int16 and draws.numel() == 1 << 20
    # each of the 256 high bytes, and in each of the four int16 lanes of a 64-bit word: chi-square
    # with 255 degrees of freedom (mean 255, sd 22.6); a lane stuck at one value or a bias of the
    # top bit puts it in the thousands
    lanes = draws.view(-1, 4).long().add(32768).div(256, rounding_mode="floor")
    for lane in lanes.T:
        counts = torch.bincount(lane, minlength=256).double()
        expected = lane.numel() / 256
        assert ((counts - expected) ** 2 / expected).sum() < 400
    # neighbouring draws are uncorrelated
    x = draws.double()
    assert abs(torch.corrcoef(torch.stack([x[:-1], x[1:]]))[0, 1]) < 0.01
    assert uniform_int16(5).numel() == 5 and fast_dropout(torch.ones(0, 3), 0.4).shape == (0, 3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["relu", "add"])
def test_fused_dropout_patterns_are_the_two_ops_on_the_same_mask(dtype, pattern):
    """FastDropout.relu (dropout(relu(x))) and .add (residual + dropout(x), one addcmul) against the
    ops they replace on the mask the same seed draws: relu bit for bit, forward and backward; add
    to one rounding of the output's dtype, its gradients bit for bit."""
    drop = FastDropout(0.3)
    g = torch.Generator().manual_seed(0)
    x, r, dy = (torch.randn(37, 24, generator=g).to(dtype) for _ in range(3))
    runs = []
    for fused in (True, False):
        xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
        torch.manual_seed(4)
        if fused:
            y = drop.relu(xs) if pattern == "relu" else drop.add(xs, rs)
        else:
            mask = keep_mask(x.shape, 0.7, dtype)
            y = torch.relu(xs) * mask if pattern == "relu" else rs + xs * mask
        y.backward(dy)
        runs.append((y.detach(), xs.grad, rs.grad))
    (y, dx, dr), (y0, dx0, dr0) = runs
    assert 0.6 < (mask > 0).float().mean() < 0.8 and torch.equal(dx, dx0)
    if pattern == "relu":
        assert torch.equal(y, y0) and dr is None
    else:
        assert (y - y0).abs().le(torch.finfo(dtype).eps * y0.abs().clamp(min=1)).all() and torch.equal(dr, dy)
    drop.eval()
    assert torch.equal(drop.add(x, r), r + x) and torch.equal(drop.relu(x), torch.relu(x))


def test_fast_dropout_encoder_layer_is_fairseqs_forward_with_its_fused_passes(tiny_data):
    """The encoder layer with --fast-dropout runs as sublayers (fused residual and ReLU dropouts); on
    the masks the same seed draws it is fairseq's forward, to rounding, gradients too."""
    from fairseq.modules.transformer_layer import TransformerEncoderLayerBase

    model, task = build(tiny_data / "bin", "transformer_qknorm", "--fast-dropout", "--dropout", "0.3",
                        "--activation-dropout", "0.2", "--attention-dropout", "0.1")
    layer = model.encoder.layers[0]
    layer.train()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(7, 3, 32, generator=g)
    pad = torch.zeros(3, 7, dtype=torch.bool)
    pad[1, :2] = True
    outs = []
    for forward in (layer.forward, lambda *a: TransformerEncoderLayerBase.forward(layer, *a)):
        torch.manual_seed(9)
        xi = x.clone().requires_grad_()
        y = forward(xi, pad)
        (y * torch.arange(y.numel()).view_as(y).sin()).sum().backward()
        outs.append((y.detach(), xi.grad, layer.fc1.weight.grad.clone()))
        layer.zero_grad()
    (y, dx, dw), (y0, dx0, dw0) = outs
    assert torch.allclose(y, y0, rtol=1e-5, atol=1e-6)
    assert torch.allclose(dx, dx0, rtol=1e-4, atol=1e-6) and torch.allclose(dw, dw0, rtol=1e-4, atol=1e-6)
    assert (y != 0).any() and dw.abs().sum() > 0


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")
def test_fast_dropout_encoder_applies_every_dropout_in_its_c_loop(tiny_data, monkeypatch):
    """The --fast-dropout encoder layers take the residual stream (len, bsz, embed) in memory order, not
    as fairseq's transposed view, so each of the encoder's dropouts (the embeddings', and per layer the
    residual, ReLU and attention ones) is one C loop, none drawn by numpy and applied by torch's ops."""
    from qknorm_fairseq import fast_dropout as fd

    model, task = build(tiny_data / "bin", "transformer_qknorm", "--fast-dropout", "--dropout", "0.3",
                        "--activation-dropout", "0.2", "--attention-dropout", "0.1")
    model.train()
    src, lengths, _ = batch(task)
    calls, numpy_masks = [], []
    monkeypatch.setattr(fd, "kernel", lambda name, *a, _run=fd.kernel: calls.append(name) or _run(name, *a))
    monkeypatch.setattr(fd, "keep_mask", lambda *a, _draw=fd.keep_mask: numpy_masks.append(a) or _draw(*a))
    out = model.encoder(src, src_lengths=lengths)["encoder_out"][0]
    out.float().sum().backward()
    layers = len(model.encoder.layers)
    assert numpy_masks == [] and out.is_contiguous()
    assert calls.count("qk_dropout_forward") == 1 + 4 * layers, calls


def test_flat_bf16_master_zeroes_only_what_the_gradient_copy_does_not_write():
    """zero_grad leaves the flat master gradient as it is; the sync then writes every parameter's
    slice: the copied gradient, or zeros for a parameter without one (as fairseq's zeroing gives),
    and zeros throughout when no backward came."""
    params = _params(0)
    flat = FlatBF16Optimizer.build_optimizer(_cfg(), params)
    for p in params:
        p.grad = torch.ones_like(p)
    flat._needs_sync = True
    flat.clip_grad_norm(0.0)
    assert flat.fp32_params.grad.eq(1).all()
    flat.zero_grad()
    assert flat.fp32_params.grad.eq(1).all()  # nothing written yet
    params[0].grad, params[2].grad = torch.full_like(params[0], 2.0), torch.full_like(params[2], 3.0)
    flat._needs_sync = True
    flat.clip_grad_norm(0.0)
    grads = flat._master_grads
    assert grads[0].eq(2).all() and grads[1].eq(0).all() and grads[2].eq(3).all()
    flat.zero_grad()
    flat.clip_grad_norm(0.0)
    assert flat.fp32_params.grad.eq(0).all()


def test_fast_dropout_under_torch_compile_draws_the_eager_masks():
    x = torch.randn(64, 48, requires_grad=True)
    step = lambda t: (fast_dropout(t.relu(), 0.4) * t).sum()  # noqa: E731
    compiled = torch.compile(step, backend="eager")
    torch.manual_seed(5)
    eager = step(x)
    (g_eager,) = torch.autograd.grad(eager, x)
    torch.manual_seed(5)
    out = compiled(x)
    (g_compiled,) = torch.autograd.grad(out, x)
    assert torch.equal(out, eager) and torch.equal(g_compiled, g_eager)


def test_fast_dropout_model_swaps_every_dropout(tiny_data):
    model, _ = build(tiny_data / "bin", "transformer_qknorm", "--fast-dropout", "--attention-dropout", "0.1")
    kinds = {type(m).__name__ for m in model.modules() if "Dropout" in type(m).__name__}
    assert kinds == {"FastDropout"}
    assert all(a.fast_dropout for a in model.modules() if hasattr(a, "qk_scale"))


SDPA = torch.nn.functional.scaled_dot_product_attention


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_qknorm"])
def test_matmul_attention_kernel_reaches_every_attention_and_trains_as_sdpa(tiny_data, arch, monkeypatch):
    """--attention-kernel matmul: no attention of the model calls scaled_dot_product_attention, and
    its loss and gradients are sdpa's up to rounding."""
    results = {}
    for kernel in ("sdpa", "matmul"):
        model, task = build(tiny_data / "bin", arch, "--attention-kernel", kernel, "--dropout", "0",
                            "--attention-dropout", "0", "--activation-dropout", "0", "--word-dropout", "0")
        src, lengths, prev = batch(task)
        calls = []
        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                            lambda *a, _calls=calls, **k: _calls.append(1) or SDPA(*a, **k))
        model.train()
        loss = model(src, lengths, prev)[0].float().logsumexp(-1).sum()
        loss.backward()
        monkeypatch.undo()
        assert {a.attention_kernel for a in model.modules() if hasattr(a, "attention_kernel")} == {kernel}
        assert bool(calls) == (kernel == "sdpa")
        results[kernel] = [loss] + [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(results["sdpa"], results["matmul"], strict=True):
        # FixNorm's embedding gradients are ~1e3; k_proj's bias gets rounding noise (~1e-9) only
        assert (a - b).abs().max() <= 1e-5 * a.abs().max() + 1e-6


def test_every_qknorm_and_fixnorm_normalisation_takes_the_hand_written_backward_to_the_bit(tiny_data, monkeypatch):
    """q and k of every attention and FixNorm's matrix go through _L2NormalizeFunction; the model's
    loss and every gradient are the bits autograd gives through the plain ops (fewer ops, no result
    changed)."""
    from qknorm_fairseq import norms

    def plain(x, eps):
        return (x / norms._fp32_norm(x).clamp(min=eps)).to(x.dtype)

    results = {}
    for backward in ("plain", "hand-written"):
        torch.manual_seed(0)
        model, task = build(tiny_data / "bin", "transformer_qknorm", "--word-dropout", "0")
        src, lengths, prev = batch(task)
        calls = []
        fn = norms._L2NormalizeFunction.apply if backward == "hand-written" else plain
        monkeypatch.setattr(norms._L2NormalizeFunction, "apply", lambda *a, _calls=calls, _fn=fn: (
            _calls.append(1) or _fn(*a)))
        model.train()
        torch.manual_seed(1)
        loss = model(src, lengths, prev)[0].float().logsumexp(-1).sum()
        loss.backward()
        monkeypatch.undo()
        attentions = [m for m in model.modules() if hasattr(m, "qk_scale")]
        # q and k in each attention (encoder self, decoder self and cross) and FixNorm's one
        assert len(calls) == 2 * len(attentions) + 1
        results[backward] = [loss] + [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(*results.values(), strict=True):
        assert torch.equal(a, b)


def test_each_attention_mask_is_built_once_per_forward_with_the_same_result(tiny_data, monkeypatch):
    """Encoder self-attention and cross-attention share the source's padding mask, every decoder
    self-attention the target's padding and future masks (a new slice of fairseq's future mask in
    each layer): two masks built per forward, not one per layer, and the same loss and gradients
    to the bit as with a mask built in every layer."""
    from qknorm_fairseq.attention import NormAttention

    results = {}
    for cache in (True, False):
        torch.manual_seed(0)
        model, task = build(tiny_data / "bin", "transformer_qknorm", "--encoder-layers", "3", "--decoder-layers", "3",
                            "--word-dropout", "0")
        src, lengths, prev = batch(task)
        built = []
        real = NormAttention._build_additive_mask
        monkeypatch.setattr(NormAttention, "_build_additive_mask", staticmethod(
            lambda kpm, am, dtype, _built=built, _real=real: (
                _built.append((kpm is not None, am is not None)) or _real(kpm, am, dtype))))
        if not cache:
            monkeypatch.setattr(NormAttention, "_additive_mask",
                                lambda self, kpm, am, dtype: NormAttention._build_additive_mask(kpm, am, dtype))
        model.train()
        torch.manual_seed(1)
        loss = model(src, lengths, prev)[0].float().logsumexp(-1).sum()
        loss.backward()
        monkeypatch.undo()
        masks = [b for b in built if b != (False, False)]
        # uncached: 3 encoder layers, then each decoder layer's self- and cross-attention, but the
        # last cross-attention's, which returns fairseq's alignment weights (the explicit path)
        assert masks == ([(True, False), (True, True)] if cache else
                         [(True, False)] * 3 + [(True, True), (True, False)] * 2 + [(True, True)]), masks
        results[cache] = [loss] + [p.grad for p in model.parameters() if p.grad is not None]
    for a, b in zip(*results.values(), strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ["transformer_prenorm", "transformer_postnorm"])
def test_encoder_without_its_padding_test_is_fairseqs_encoder(tiny_data, arch):
    """Our encoder always passes the padding mask (no host sync); fairseq's passes None when a batch
    has no padding. Same outputs, bit for bit, with and without padding (post-norm: the first
    projections take the layer's input as fairseq lays it out)."""
    model, task = build(tiny_data / "bin", arch)
    model.eval()
    src, lengths, _ = batch(task)
    for tokens in (src, src[[0, 2]]):  # rows 0 and 2 have no padding
        with torch.no_grad():
            ours = model.encoder(tokens, src_lengths=lengths[: len(tokens)])
            theirs = TransformerEncoderBase.forward_scriptable(model.encoder, tokens, lengths[: len(tokens)])
        assert torch.equal(ours["encoder_out"][0], theirs["encoder_out"][0])
        assert torch.equal(ours["src_lengths"][0], theirs["src_lengths"][0])
    model.train()  # with dropout, and the gradients
    grads = []
    for forward in (model.encoder, lambda *a: TransformerEncoderBase.forward_scriptable(model.encoder, *a)):
        torch.manual_seed(4)
        out = forward(src, lengths)["encoder_out"][0]
        (out * torch.arange(out.numel()).view_as(out).sin()).sum().backward()
        grads.append([out.detach()] + [p.grad.clone() for p in model.encoder.parameters() if p.grad is not None])
        model.zero_grad()
    assert len(grads[0]) > 1 and all(torch.equal(a, b) for a, b in zip(*grads, strict=True))


def test_decoder_builds_the_padding_mask_in_training_only(tiny_data):
    model, _ = build(tiny_data / "bin", "transformer_qknorm")
    model.train()
    assert model.decoder.cross_self_attention is True
    model.eval()
    assert model.decoder.cross_self_attention is False


def test_training_loss_is_the_same_with_the_decoders_mask_forced(tiny_data):
    """In training the decoder self-attention always gets the padding mask; on targets without padding
    (where fairseq's rule, mask only when there is padding, passes none) the loss equals fairseq's bit
    for bit. With padding both rules build the mask, so only this case tests the change."""
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--dropout", "0", "--attention-dropout", "0",
                        "--activation-dropout", "0", "--word-dropout", "0")
    src, lengths, prev = batch(task)
    assert not prev.eq(task.target_dictionary.pad()).any()
    model.train()
    forced = model(src, lengths, prev)[0]
    cls = type(model.decoder)
    ours = cls.__dict__["cross_self_attention"]
    cls.cross_self_attention = property(lambda self: False, lambda self, v: None)
    try:
        plain = model(src, lengths, prev)[0]
    finally:
        cls.cross_self_attention = ours
    assert torch.equal(forced, plain)


def test_criterion_with_the_decoders_mask_equals_the_isfinite_search():
    torch.manual_seed(0)
    allowed = torch.rand(50) > 0.3
    logits = torch.randn(20, 50).masked_fill(~allowed, float("-inf"))
    lprobs = torch.log_softmax(logits, -1)
    target = torch.randint(0, 50, (20,))
    target[target.clone().apply_(lambda t: not allowed[t])] = int(allowed.nonzero()[0])
    a = masked_label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=1)
    b = masked_label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=1, allowed=allowed)
    assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_bucket_bounds_and_batches():
    lengths = np.array([3, 5, 5, 9, 12, 17, 20, 33, 40, 41])
    bounds = bucket_bounds(lengths, 3)
    assert bounds == [16, 24, 48]  # the 1/3, 2/3 and 1 quantiles 9, 20, 41 rounded up to multiples of 8
    indices = np.argsort(lengths, kind="stable")
    batches = bucket_batches(indices, lengths[indices], bounds, max_tokens=48, multiple=2)
    assert sorted(np.concatenate(batches).tolist()) == list(range(10))  # every sentence once
    # bucket 16: 48 // 16 = 3 -> 2 a batch (5 members: 1 carried); bucket 24: 2 (1 carried); bucket 48: 1
    assert [len(b) for b in batches] == [2, 2, 2, 1, 1, 1, 1]
    for b in batches:
        assert len(b) * max(bounds[np.searchsorted(bounds, lengths[b].max())], 1) <= 48


def test_length_buckets_give_few_shapes_and_the_same_loss(tiny_data):
    """An epoch of --length-buckets 4 has at most 5 shapes; a batch padded to its bucket has the loss
    of the same batch padded as fairseq pads it."""
    model, task = build(tiny_data / "bin", "transformer_postnorm", "--dropout", "0", "--attention-dropout", "0",
                        "--activation-dropout", "0", "--word-dropout", "0", "--task", "translation_qk",
                        "--length-buckets", "4")
    task.load_dataset("train")
    ds = task.dataset("train")
    assert isinstance(ds, LengthBucketDataset)
    indices = ds.ordered_indices()
    batches = ds.batch_by_size(indices, max_tokens=200, required_batch_size_multiple=8)
    shapes = set()
    for b in batches:
        s = ds.collater([ds[int(i)] for i in b])
        shapes.add((s["net_input"]["src_tokens"].shape, s["target"].shape))
    assert len(shapes) <= 5 and len(batches) > 5
    samples = [ds[int(i)] for i in batches[0]]
    padded, plain = ds.collater(samples), ds.dataset.collater(samples)
    assert padded["net_input"]["src_tokens"].size(1) > plain["net_input"]["src_tokens"].size(1) or \
        padded["target"].size(1) > plain["target"].size(1)
    model.eval()
    crit = task.build_criterion(type("A", (), {"criterion": "masked_label_smoothed_cross_entropy",
                                               "label_smoothing": 0.1, "sentence_avg": False,
                                               "ignore_prefix_size": 0, "report_accuracy": False})())
    with torch.no_grad():
        loss_padded = crit(model, padded)[0]
        loss_plain = crit(model, plain)[0]
    assert torch.allclose(loss_padded, loss_plain, rtol=1e-5)


def test_negative_length_buckets_is_an_error(tiny_data):
    _, task = build(tiny_data / "bin", "transformer_postnorm", "--task", "translation_qk", "--length-buckets", "-1")
    with pytest.raises(ValueError, match="--length-buckets -1 must be >= 0"):
        task.load_dataset("train")


def test_train_sh_precision_on_a_cpu(monkeypatch, tmp_path):
    from qknorm_pipeline import train
    from qknorm_pipeline.cli import UserError
    from qknorm_pipeline.paths import folders

    monkeypatch.setenv("DATA_BIN", str(tmp_path))
    monkeypatch.setattr(train.hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(train.hardware, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(train.hardware, "cpu_bf16_speedup", lambda env=None: 2.0)
    run = train.plan("gl-en", "qknorm", train.Options(precision="bf16"))
    assert run.fairseq_args[-2:] == ["--cpu", "--bf16"] and run.where == "CPU (bf16)"
    assert "--bf16" not in train.plan("gl-en", "qknorm", train.Options()).fairseq_args
    monkeypatch.setattr(train.hardware, "cpu_has_bf16", lambda: False)
    with pytest.raises(UserError, match="no native bf16 instructions .* drop --precision"):
        train.plan("gl-en", "qknorm", train.Options(precision="bf16"))
    with pytest.raises(UserError, match="--precision fp16 needs a GPU"):
        train.plan("gl-en", "qknorm", train.Options(precision="fp16"))
    # a stock row (study.sh) alike: it once started emulated bf16 at 1/40 of fp32's speed
    stock = ["bin", "--arch", "transformer", "--max-update", "10", "--save-dir", str(tmp_path / "gl-en" / "s")]
    with pytest.raises(UserError, match="no native bf16 instructions .* drop --precision"):
        train.plan_stock("gl-en", "fairseq_transformer", "s", stock, "bf16", folders())
    assert "--bf16" not in train.plan_stock("gl-en", "fairseq_transformer", "s", stock, "fp32", folders()).fairseq_args


def test_train_sh_fast_in_bf16_needs_multi_tensor_adam(monkeypatch, tmp_path):
    """--fast's bf16 flags include --fused-adam, an option of multi_tensor_adam only: another optimizer
    is refused in one line before anything starts."""
    from qknorm_pipeline import train

    monkeypatch.setenv("DATA_BIN", str(tmp_path))
    monkeypatch.setattr(train.hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(train.hardware, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(train.hardware, "cpu_bf16_speedup", lambda env=None: 2.0)
    run = train.plan("gl-en", "qknorm", train.Options(precision="bf16", fast=True))
    assert run.fairseq_args[-3:] == ["--fused-kernels", "--fused-adam", "--packed-encoder"]
    assert run.where == "CPU (bf16, fast path)"
    with pytest.raises(train.UsageError, match=r"^--fast with --precision bf16 adds --fused-adam, an option of "
                                               r"--optimizer multi_tensor_adam, not of --optimizer adam: drop "
                                               r"--optimizer adam, or --fast$"):
        train.plan("gl-en", "qknorm", train.Options(precision="bf16", fast=True, extra=["--optimizer", "adam"]))
    fp32 = train.plan("gl-en", "qknorm", train.Options(fast=True, extra=["--optimizer", "adam"])).fairseq_args
    assert "--fused-adam" not in fp32 and "--packed-decoder" in fp32


def test_bf16_slower_than_fp32_on_a_cpu_is_said_once(monkeypatch, tmp_path, capsys):
    from qknorm_pipeline import train

    monkeypatch.setenv("DATA_BIN", str(tmp_path))
    monkeypatch.setattr(train.hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(train.hardware, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(train, "_WARNED", {})
    monkeypatch.setattr(train.hardware, "_BF16", {"speedup": 2.5})
    train.plan("gl-en", "qknorm", train.Options(precision="bf16"))
    assert "warning" not in capsys.readouterr().err
    monkeypatch.setattr(train.hardware, "_BF16", {"speedup": 0.61})
    for _ in range(2):
        run = train.plan("gl-en", "qknorm", train.Options(precision="bf16"))
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "runs at 0.61x the speed of fp32's" in err and "drop --precision" in err
    assert run.fairseq_args[-2:] == ["--cpu", "--bf16"]  # a warning, not a fallback


def test_bf16_probe_times_this_cpu_once(monkeypatch):
    from qknorm_pipeline import hardware
    from qknorm_pipeline.cli import UserError

    monkeypatch.setattr(hardware, "_BF16", {})
    # an eighth of the probe's rows: the same code, seconds less where torch emulates bf16
    monkeypatch.setattr(hardware, "BF16_PROBE", hardware.BF16_PROBE.replace("randn(4096,", "randn(512,"))
    speedup = hardware.cpu_bf16_speedup()
    assert 0.01 < speedup < 100
    monkeypatch.setattr(hardware.subprocess, "run", lambda *a, **k: pytest.fail("probed twice"))
    assert hardware.cpu_bf16_speedup() == speedup
    monkeypatch.undo()
    monkeypatch.setattr(hardware, "_BF16", {})
    monkeypatch.setattr(hardware, "BF16_PROBE", "raise SystemExit('no bf16 kernels here')")
    with pytest.raises(UserError, match=r"the bf16 speed probe failed \(no bf16 kernels here\)"):
        hardware.cpu_bf16_speedup()


def test_reproduce_sh_fast_reaches_every_training(monkeypatch):
    from qknorm_pipeline import reproduce

    seen = []
    monkeypatch.setattr(reproduce, "reproduce", lambda pair, systems, seeds, opts, extra: seen.append(opts))
    reproduce.main(["demo", "--fast", "--precision", "bf16"])
    reproduce.main(["demo"])
    assert seen == [{"precision": "bf16", "fast": True}, {}]
