"""`--optimizer multi_tensor_adam` against fairseq's own Adam (fairseq/optim/adam.py), on the CPU, and
--fused-adam's C loops (csrc/flat_adam.c: a flat bf16 master, fp32 parameters in place) against the formula
in fp64."""
import copy

import pytest
import torch
from fairseq import utils
from fairseq.optim.adam import Adam as FairseqAdamImpl
from omegaconf import OmegaConf

from qknorm_fairseq import fused_kernels, native
from qknorm_fairseq.optimizer import FairseqMultiTensorAdam, MultiTensorAdam, grad_norm


def _params(seed=0):
    g = torch.Generator().manual_seed(seed)
    shapes = [(7, 5), (5,), (3, 4, 2), (1,)]
    return [torch.nn.Parameter(torch.randn(*s, generator=g)) for s in shapes]


def _grads(step, params):
    g = torch.Generator().manual_seed(100 + step)
    # gradients of very different scales, some near eps, as real layers have
    return [torch.randn(p.shape, generator=g) * 10.0 ** (-i - 3 * (step % 2)) for i, p in enumerate(params)]


@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_updates_equal_fairseqs_adam_to_1e_6(weight_decay):
    ours_p, ref_p = _params(), _params()
    ours = MultiTensorAdam(ours_p, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay)
    ref = FairseqAdamImpl(ref_p, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay)
    for step in range(30):
        for p, q, g in zip(ours_p, ref_p, _grads(step, ours_p)):
            p.grad, q.grad = g.clone(), g.clone()
        if step == 10:  # an LR change, as fairseq's scheduler makes through set_lr
            for opt in (ours, ref):
                opt.param_groups[0]["lr"] = 1e-3
        ours.step()
        ref.step()
        for p, q in zip(ours_p, ref_p):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-12)
    for p, q in zip(ours_p, ref_p):
        assert ours.state[p]["step"] == ref.state[q]["step"] == 30
        torch.testing.assert_close(ours.state[p]["exp_avg_sq"], ref.state[q]["exp_avg_sq"], rtol=1e-6, atol=0)


def test_state_resumes_with_either_optimizer():
    """A checkpoint's optimizer state from fairseq's adam continues in ours with the same result."""
    a, b = _params(), _params()
    ref, ref2 = FairseqAdamImpl(a, lr=1e-3), FairseqAdamImpl(b, lr=1e-3)
    for step in range(5):
        for p, q, g in zip(a, b, _grads(step, a)):
            p.grad, q.grad = g.clone(), g.clone()
        ref.step()
        ref2.step()
    ours = MultiTensorAdam(b, lr=1e-3)
    ours.load_state_dict(copy.deepcopy(ref2.state_dict()))
    for step in range(5, 10):
        for p, q, g in zip(a, b, _grads(step, a)):
            p.grad, q.grad = g.clone(), g.clone()
        ref.step()
        ours.step()
    for p, q in zip(a, b):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-12)


def test_a_parameter_without_gradient_is_left_alone_and_half_precision_is_refused():
    params = _params()
    opt = MultiTensorAdam(params, lr=1e-3)
    before = params[1].detach().clone()
    for p, g in zip(params, _grads(0, params)):
        p.grad = g
    params[1].grad = None
    opt.step()
    assert torch.equal(params[1], before) and not opt.state[params[1]]
    half = [torch.nn.Parameter(torch.zeros(3, dtype=torch.bfloat16))]
    half[0].grad = torch.ones(3, dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="needs fp32 parameters"):
        MultiTensorAdam(half).step()


@pytest.mark.skipif(not fused_kernels.has_compiler(), reason="no C++ compiler on PATH: torch.compile cannot build the CPU kernels")
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_fused_update_equals_fairseqs_adam_with_the_gradients_scale_folded_in(weight_decay, monkeypatch):
    """--fused-adam: fairseq's Adam (its gradients divided by the scale first) against the compiled loop
    given the scaled gradients and the scale, on tensors of several shapes, through an LR change (the
    compiled loop: what steps where the C loop does not, on a GPU or without a C compiler)."""
    monkeypatch.setattr(MultiTensorAdam, "c_steps", lambda self, params: False)
    ours_p, ref_p = _params(), _params()
    ours = MultiTensorAdam(ours_p, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay, fused=True)
    ref = FairseqAdamImpl(ref_p, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay)
    for step in range(12):
        scale = torch.tensor(1.0 + step)  # a tensor, as fairseq's clipping factor is
        for p, q, g in zip(ours_p, ref_p, _grads(step, ours_p)):
            p.grad, q.grad = g * scale, g.clone()
        if step == 6:
            for opt in (ours, ref):
                opt.param_groups[0]["lr"] = 1e-3
        ours.step(scale=scale)
        ref.step()
        for p, q in zip(ours_p, ref_p):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-12)
    for p, q in zip(ours_p, ref_p):
        assert ours.state[p]["step"] == ref.state[q]["step"] == 12
        torch.testing.assert_close(ours.state[p]["exp_avg"], ref.state[q]["exp_avg"], rtol=1e-5, atol=1e-12)


needs_c = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build csrc/flat_adam.c")


def _adam_fp64(p, m, v, g, step, lr, betas, eps, decay):
    """fairseq's Adam on one fp64 tensor, in place (decoupled weight decay, eps after the sqrt)."""
    m.mul_(betas[0]).add_(g, alpha=1 - betas[0])
    v.mul_(betas[1]).addcmul_(g, g, value=1 - betas[1])
    p.add_(p, alpha=-decay * lr)
    p.sub_(m / (v.sqrt() + eps) * (lr * (1 - betas[1] ** step) ** 0.5 / (1 - betas[0] ** step)))


@needs_c
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_c_step_of_a_flat_bf16_master_is_adams_formula_in_fp64(weight_decay):
    """--fused-adam under --bf16 on a CPU: csrc/flat_adam.c steps the flat fp32 master from the bf16
    gradients times the clipping factor (one tensor without a gradient: zeros) and writes the bf16
    weights, against fairseq's formula in fp64 over 12 steps and an LR change (the master within 1e-6,
    fp32's rounding of weights of about 1, while the steps move them by about 3e-2; the moments within
    1e-6 of their largest), the weights torch's own rounding of the master, the same bits on 1 and 2 threads."""
    shapes = [(37, 33), (5,), (4099,), (3, 4, 2)]  # sizes that are no multiple of a vector's width
    g = torch.Generator().manual_seed(3)
    masters = {}
    for threads in (1, 2):
        weights = [torch.randn(s, generator=torch.Generator().manual_seed(i)).bfloat16() for i, s in enumerate(shapes)]
        weights0 = [w.clone() for w in weights]
        flat = torch.nn.Parameter(torch.cat([w.float().reshape(-1) for w in weights]))
        adam = MultiTensorAdam([flat], lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay, fused=True)
        ref = [flat.detach().double().clone(), torch.zeros(flat.numel(), dtype=torch.float64),
               torch.zeros(flat.numel(), dtype=torch.float64)]
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            for step in range(1, 13):
                g.manual_seed(step)
                grads = [torch.randn(s, generator=g).bfloat16() * 10.0 ** -i for i, s in enumerate(shapes)]
                grads[1] = None
                factor = 0.25 + step / 8
                if step == 7:
                    adam.param_groups[0]["lr"] = 1e-3
                adam.flat_bf16_step(weights, grads, torch.tensor(factor))
                dense = torch.cat([torch.zeros(s).reshape(-1) if gr is None else gr.double().reshape(-1) * factor
                                   for s, gr in zip(shapes, grads)])
                _adam_fp64(*ref, dense, step, adam.param_groups[0]["lr"], (0.9, 0.98), 1e-8, weight_decay)
        finally:
            torch.set_num_threads(before)
        torch.testing.assert_close(flat.detach().double(), ref[0], rtol=1e-6, atol=1e-6)
        assert (ref[0] - torch.cat([w.double().reshape(-1) for w in weights0])).abs().max() > 1e-2
        state = adam.state[flat]
        assert state["step"] == 12
        for ours, exact in zip((state["exp_avg"], state["exp_avg_sq"]), ref[1:]):
            assert (ours.double() - exact).abs().max() <= 1e-6 * exact.abs().max()
        for w, master in zip(weights, flat.detach().split([w.numel() for w in weights])):
            assert w.dtype == torch.bfloat16 and torch.equal(w.reshape(-1), master.bfloat16())
        masters[threads] = flat.detach().clone()
    assert torch.equal(masters[1], masters[2])


@needs_c
def test_the_bf16_gradient_norm_is_the_fp64_norm():
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(s, generator=g).bfloat16() * 3 for s in [(4096 * 3 + 17,), (7, 9), (1,)]]
    norm = grad_norm(grads + [torch.empty(4)], grads + [None])
    assert norm.dtype == torch.float32 and norm.shape == ()
    expected = torch.cat([x.double().reshape(-1) for x in grads]).norm()
    torch.testing.assert_close(norm.double(), expected, rtol=1e-6, atol=0)  # fp32 partial sums of 256 squares
    assert torch.equal(norm, grad_norm(grads + [torch.empty(4)], grads + [None]))


@needs_c
@pytest.mark.parametrize("weight_decay", [0.0, 0.01])
def test_the_c_step_of_fp32_parameters_is_adams_formula_in_fp64(weight_decay):
    """--fused-adam in fp32 on a CPU: csrc/flat_adam.c steps every parameter in place in one call, its gradient
    times the clipping factor and 1 / scale, against fairseq's formula in fp64 over 12 steps and an LR change
    (within 1e-6, fp32's rounding of weights of about 1, while the steps move them by about 3e-2; the moments
    within 1e-6 of their largest); a parameter without a gradient keeps its value and gets no state; the same
    bits on 1 and 2 threads."""
    shapes = [(37, 33), (5,), (4099,), (3, 4, 2)]
    results = {}
    for threads in (1, 2):
        params = [torch.nn.Parameter(torch.randn(s, generator=torch.Generator().manual_seed(i))) for i, s in enumerate(shapes)]
        idle = params[1].detach().clone()
        adam = MultiTensorAdam(params, lr=3e-3, betas=(0.9, 0.98), eps=1e-8, weight_decay=weight_decay, fused=True)
        refs = [[p.detach().double().clone(), torch.zeros(s, dtype=torch.float64), torch.zeros(s, dtype=torch.float64)]
                for p, s in zip(params, shapes)]
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        g = torch.Generator().manual_seed(3)
        try:
            for step in range(1, 13):
                grads = [torch.randn(s, generator=g) * 10.0 ** -i for i, s in enumerate(shapes)]
                for i, (p, gr) in enumerate(zip(params, grads)):
                    p.grad = None if i == 1 else gr.clone()
                assert adam.c_steps([p for p in params if p.grad is not None])
                if step == 7:
                    adam.param_groups[0]["lr"] = 1e-3
                adam.clip_factor, scale = 0.5 + step / 16, torch.tensor(1.0 + step / 4)
                adam.step(scale=scale)
                assert adam.clip_factor == 1.0  # used once
                for i, (ref, gr) in enumerate(zip(refs, grads)):
                    if i != 1:
                        factor = (0.5 + step / 16) / (1.0 + step / 4)
                        _adam_fp64(*ref, gr.double() * factor, step, adam.param_groups[0]["lr"], (0.9, 0.98), 1e-8,
                                   weight_decay)
        finally:
            torch.set_num_threads(before)
        assert torch.equal(params[1].detach(), idle) and not adam.state[params[1]]
        for i, (p, ref) in enumerate(zip(params, refs)):
            if i == 1:
                continue
            torch.testing.assert_close(p.detach().double(), ref[0], rtol=1e-6, atol=1e-6)
            state = adam.state[p]
            assert state["step"] == 12
            for ours, exact in zip((state["exp_avg"], state["exp_avg_sq"]), ref[1:]):
                assert (ours.double() - exact).abs().max() <= 1e-6 * exact.abs().max()
        assert (refs[0][0] - torch.randn(shapes[0], generator=torch.Generator().manual_seed(0)).double()).abs().max() > 1e-2
        results[threads] = [p.detach().clone() for p in params]
    assert all(torch.equal(a, b) for a, b in zip(results[1], results[2]))


@needs_c
def test_fp32_clipping_under_the_c_step_is_fairseqs_clipping_then_its_adam():
    """multi_tensor_adam with --fused-adam in fp32: clip_grad_norm returns the gradients' norm (summed in fp64) and
    leaves the gradients as they are, and the step applies the factor: the same parameters (within 1e-7, fp32's
    rounding of weights of about 1: another order of rounding) as fairseq's clip_grad_norm_ (the gradients
    multiplied) followed by fairseq's Adam, over steps that clip and steps that do not."""
    cfg = OmegaConf.create({"_name": "multi_tensor_adam", "adam_betas": "(0.9, 0.98)", "adam_eps": 1e-8,
                            "weight_decay": 0.0, "lr": [3e-3], "fused_adam": True})
    ours_p, ref_p = _params(), _params()
    ours = FairseqMultiTensorAdam(cfg, ours_p)
    ref = FairseqAdamImpl(ref_p, lr=3e-3, betas=(0.9, 0.98), eps=1e-8)
    clipped = []
    for step in range(8):
        max_norm = 1.0 if step % 2 == 0 else 1e6
        for p, q, gr in zip(ours_p, ref_p, _grads(step, ours_p)):
            p.grad, q.grad = gr * 50, gr * 50
        kept = [p.grad.clone() for p in ours_p]
        norm = ours.clip_grad_norm(max_norm)
        theirs = utils.clip_grad_norm_(ref_p, max_norm)
        torch.testing.assert_close(norm, theirs, rtol=1e-6, atol=0)
        clipped.append(bool(theirs > max_norm))
        assert all(torch.equal(p.grad, k) for p, k in zip(ours_p, kept))
        assert ours._optimizer.clip_factor == pytest.approx(min(1.0, max_norm / (float(theirs) + 1e-6)))
        ours.step()
        ref.step()
        for p, q in zip(ours_p, ref_p):
            torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-7)
    assert any(clipped) and not all(clipped)  # both kinds of step ran
