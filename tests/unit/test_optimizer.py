"""`--optimizer multi_tensor_adam` against fairseq's own Adam (fairseq/optim/adam.py), on the CPU."""
import copy

import pytest
import torch
from fairseq.optim.adam import Adam as FairseqAdamImpl

from qknorm_fairseq import fused_kernels
from qknorm_fairseq.optimizer import MultiTensorAdam


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
def test_the_fused_update_equals_fairseqs_adam_with_the_gradients_scale_folded_in(weight_decay):
    """--fused-adam: fairseq's Adam (its gradients divided by the scale first) against the compiled loop
    given the scaled gradients and the scale, on tensors of several shapes, through an LR change."""
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
