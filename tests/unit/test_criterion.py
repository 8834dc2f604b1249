"""masked_label_smoothed_cross_entropy (qknorm_fairseq/criterion.py) against fairseq's label
smoothing and against the original code's form of it; --fused-loss against autograd through
log_softmax."""
import pytest
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from qknorm_fairseq import criterion
from qknorm_fairseq.criterion import FusedLabelSmoothedNLL, masked_label_smoothed_nll_loss
from qknorm_fairseq.fused_kernels import has_compiler

from helpers import TINY_MODEL, USER_DIR, batch


def test_masked_label_smoothing():
    torch.manual_seed(0)
    lprobs = torch.log_softmax(torch.randn(5, 10), -1)
    target = torch.tensor([1, 2, 3, 0, 4])
    ours = masked_label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=0)
    ref = label_smoothed_nll_loss(lprobs, target, 0.1, ignore_index=0)
    assert all(torch.allclose(a, b) for a, b in zip(ours, ref)), "no mask: identical to fairseq"
    allowed = torch.tensor([True] * 6 + [False] * 4)
    masked = torch.log_softmax(torch.randn(5, 10).masked_fill(~allowed, float("-inf")), -1)
    loss, nll = masked_label_smoothed_nll_loss(masked, target, 0.1, ignore_index=0)
    sub = masked[:, allowed]  # the same loss computed on the allowed sub-vocabulary
    ref_loss, ref_nll = label_smoothed_nll_loss(sub, target, 0.1, ignore_index=0)
    assert torch.isfinite(loss) and torch.allclose(loss, ref_loss) and torch.allclose(nll, ref_nll)


def cross_entropy_with(target_dist, lprobs):
    return -(target_dist * lprobs).sum(-1)


def test_the_uniform_form_is_the_originals_and_differs_by_epsilon_over_n():
    """Both originals put (1 - eps) + eps/N on the gold type and eps/N on each other type (N allowed
    types): `uniform=True`. fairseq's form, the default, puts 1 - eps on the gold and eps/(N-1) on each
    other. Each is the cross-entropy against its target distribution, written out here; the loss
    difference is (eps/N) * (mean log p of the others - log p of the gold), 1/N of the smoothing
    term: with a gl->en-sized target vocabulary a few 1e-4 nats (docs/training.md)."""
    torch.manual_seed(1)
    eps, n, rows = 0.1, 4000, 64
    logits = torch.randn(rows, n) * 3
    target = torch.randint(0, n, (rows,))
    logits[torch.arange(rows), target] += 12  # a trained model: the gold type far ahead
    lprobs = torch.log_softmax(logits.double(), -1)
    gold = torch.nn.functional.one_hot(target, n).double()
    original = cross_entropy_with((1 - eps) * gold + eps / n, lprobs)
    fairseq_form = cross_entropy_with((1 - eps) * gold + eps / (n - 1) * (1 - gold), lprobs)
    ours, _ = masked_label_smoothed_nll_loss(lprobs, target, eps, reduce=False)
    uniform, _ = masked_label_smoothed_nll_loss(lprobs, target, eps, reduce=False, uniform=True)
    assert torch.allclose(ours, fairseq_form) and torch.allclose(uniform, original)
    others_mean = (lprobs * (1 - gold)).sum(-1) / (n - 1)
    gold_lp = lprobs[torch.arange(rows), target]
    assert torch.allclose(original - ours, eps / n * (others_mean - gold_lp), atol=1e-12)
    assert ((original - ours).abs() / ours).max().item() < 1e-3


def test_the_uniform_form_over_a_mask_spreads_over_the_allowed_types_only():
    """With a mask the original divides by the number of allowed types (model.py: the smoothing sum
    over the masked log-probabilities over logit_mask.sum())."""
    torch.manual_seed(2)
    eps = 0.1
    allowed = torch.tensor([True] * 7 + [False] * 3)
    lprobs = torch.log_softmax(torch.randn(6, 10, dtype=torch.float64).masked_fill(~allowed, float("-inf")), -1)
    target = torch.tensor([0, 3, 6, 2, 1, 5])
    gold = torch.nn.functional.one_hot(target, 10).double()
    dist = (1 - eps) * gold + eps / 7 * allowed.double()
    expected = -(dist * lprobs.masked_fill(~allowed, 0.0)).sum(-1)
    loss, _ = masked_label_smoothed_nll_loss(lprobs, target, eps, reduce=False, allowed=allowed, uniform=True)
    assert torch.allclose(loss, expected, rtol=1e-12)


def _fused_and_reference(logits, target, allowed, eps=0.1, pad=1, uniform=False, kernels=False):
    """(loss, nll, grad) of --fused-loss (KERNELS: with --fused-kernels' compiled loops) and of
    autograd through log_softmax and masked_label_smoothed_nll_loss, for the loss + 0.3 nll (so both
    outputs carry a gradient)."""
    out = []
    for fused in (True, False):
        x = logits.detach().clone().requires_grad_()
        if fused:
            loss, nll = FusedLabelSmoothedNLL.apply(x, target, eps, pad, allowed, uniform, kernels)
        else:
            every = allowed if allowed is not None else torch.ones(x.size(-1), dtype=torch.bool)
            loss, nll = masked_label_smoothed_nll_loss(torch.log_softmax(x.double(), -1), target, eps,
                                                       ignore_index=pad, allowed=every, uniform=uniform)
        (loss + 0.3 * nll).backward()
        # the fused path works in place on copies of its blocks, never on the logits themselves
        assert torch.equal(x.detach(), logits)
        out.append((loss.detach(), nll.detach(), x.grad))
    return out


COMPILED = pytest.param(True, marks=pytest.mark.skipif(
    not has_compiler(), reason="no C++ compiler: --fused-kernels cannot compile"))


@pytest.mark.parametrize("kernels", [False, COMPILED])
@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_fused_loss_is_the_log_softmax_loss(monkeypatch, masked, uniform, kernels):
    """In fp64, over blocks of 3 rows (the eager path's; KERNELS: one compiled loop): padding rows,
    masked types and a target the mask forbids (its
    nll clamped at MASKED_TARGET_NLL, no gradient through it) give the same loss and gradient."""
    monkeypatch.setattr(criterion, "FUSED_BLOCK", 40)  # 11 types: 3 rows a block, 13 blocks
    torch.manual_seed(0)
    logits = torch.randn(37, 11, dtype=torch.float64) * 3
    target = torch.randint(2, 11, (37,))
    target[:4] = 1  # padding
    allowed = None
    if masked:
        allowed = torch.ones(11, dtype=torch.bool)
        allowed[[2, 5]] = False
        logits = logits.masked_fill(~allowed, float("-inf"))
        target[6] = 5
    (loss, nll, grad), (ref_loss, ref_nll, ref_grad) = _fused_and_reference(logits, target, allowed, uniform=uniform,
                                                                            kernels=kernels)
    if masked:
        assert ref_nll > criterion.MASKED_TARGET_NLL  # the forbidden target is in the sum
    assert torch.allclose(loss, ref_loss, rtol=1e-12) and torch.allclose(nll, ref_nll, rtol=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-14)
    assert not grad[:4].any(), "padding rows get no gradient"


@pytest.mark.parametrize("fused", [False, True, COMPILED], ids=["log_softmax", "fused", "fused-kernels"])
def test_an_allowed_target_far_behind_keeps_its_loss_and_gradient(fused):
    """Only a target the mask forbids costs MASKED_TARGET_NLL: an allowed one whose log-probability
    is below -MASKED_TARGET_NLL (a diverging run) keeps its nll and its gradient, as in fairseq's
    label_smoothed_nll_loss (fp64, no mask: the same loss written out by fairseq)."""
    torch.manual_seed(4)
    logits = torch.randn(6, 9, dtype=torch.float64)
    target = torch.tensor([2, 3, 4, 5, 6, 7])
    logits[0, 2] -= 150.0  # nll about 150
    logits[3, 5] -= 400.0
    x = logits.clone().requires_grad_()
    if fused is False:
        loss, nll = masked_label_smoothed_nll_loss(torch.log_softmax(x, -1), target, 0.1, ignore_index=1,
                                                   allowed=torch.ones(9, dtype=torch.bool))
    else:
        loss, nll = FusedLabelSmoothedNLL.apply(x, target, 0.1, 1, None, False, fused)
    (loss + 0.3 * nll).backward()
    y = logits.clone().requires_grad_()
    ref_loss, ref_nll = label_smoothed_nll_loss(torch.log_softmax(y, -1), target, 0.1, ignore_index=1)
    (ref_loss + 0.3 * ref_nll).backward()
    assert ref_nll > 500 and torch.allclose(nll, ref_nll, rtol=1e-12) and torch.allclose(loss, ref_loss, rtol=1e-12)
    assert torch.allclose(x.grad, y.grad, rtol=1e-10, atol=1e-14)
    assert x.grad[0, 2] < -0.9 and x.grad[3, 5] < -0.9, "the far-behind gold types are pulled up"


@pytest.mark.parametrize("kernels", [False, COMPILED])
def test_fused_loss_on_bf16_logits_accumulates_in_fp32(kernels):
    """bf16 logits of the gl->en size, no mask: the loss of the very same values computed in fp64, to fp32
    rounding; the gradient comes back in bf16 and equals the fp64 one to bf16 rounding."""
    torch.manual_seed(1)
    logits = (torch.randn(512, 3172) * 4 - 20).bfloat16()  # off zero: an error in n (types) shows
    target = torch.randint(2, 3172, (512,))
    target[:20] = 1
    (loss, nll, grad), (ref_loss, ref_nll, ref_grad) = _fused_and_reference(logits, target, None, kernels=kernels)
    assert loss.dtype == torch.float32 and grad.dtype == torch.bfloat16
    assert torch.allclose(loss.double(), ref_loss, rtol=1e-6) and torch.allclose(nll.double(), ref_nll, rtol=1e-6)
    assert ref_grad.dtype == torch.bfloat16  # the fp64 gradient rounded to bf16
    # one bf16 step, or fp32's ~1e-7 where softmax and the smoothing term nearly cancel
    assert torch.allclose(grad.double(), ref_grad.double(), rtol=2 ** -7, atol=1e-7)


def _criterion_and_model(data_bin, *flags):
    from fairseq import options, tasks

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data_bin), "--user-dir", USER_DIR, "--arch", "transformer_fixnorm", *TINY_MODEL, "--share-all-embeddings",
        "--criterion", "masked_label_smoothed_cross_entropy", "--label-smoothing", "0.1", *flags])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task.build_criterion(args), task.build_model(args), task


def _sample(task):
    src, lengths, prev = batch(task)
    target = torch.cat([prev[:, 1:], prev[:, :1]], 1)
    target[0, -2:] = task.target_dictionary.pad()
    return {"net_input": {"src_tokens": src, "src_lengths": lengths, "prev_output_tokens": prev},
            "target": target, "ntokens": int(target.ne(task.target_dictionary.pad()).sum())}


def test_fused_loss_flag_in_the_criterion(tiny_data):
    """`--fused-loss` parsed by fairseq: the criterion's loss, nll and every parameter's gradient on a
    batch of transformer_fixnorm (its logit mask on) equal those without the flag."""
    results = []
    for flags in ((), ("--fused-loss",)):
        crit, model, task = _criterion_and_model(tiny_data / "bin", *flags)
        assert crit.fused_loss == bool(flags) and model.decoder.mask_output
        sample = _sample(task)
        torch.manual_seed(3)  # the same dropout masks
        loss, _, log = crit(model, sample)
        loss.backward()
        results.append((loss.detach(), log["nll_loss"], {n: p.grad for n, p in model.named_parameters()}))
    (loss, nll, grads), (f_loss, f_nll, f_grads) = results
    assert torch.allclose(loss, f_loss, rtol=1e-5) and torch.allclose(nll, f_nll, rtol=1e-5)
    for name, g in grads.items():
        assert torch.allclose(g, f_grads[name], rtol=1e-4, atol=1e-7), name


@pytest.mark.parametrize("fused", [(), ("--fused-loss",)])
def test_label_smoothing_form_flag_gives_the_originals_loss(tiny_data, fused):
    """`--label-smoothing-form uniform` parsed by fairseq: the criterion's loss on a batch of
    transformer_fixnorm (eval mode, logit mask on) is the cross-entropy against (1 - eps) onehot +
    eps/N over the N allowed types, written out from the model's own log-probabilities; the default
    is fairseq's form, which differs from it."""
    losses = {}
    for form in ("fairseq", "uniform"):
        crit, model, task = _criterion_and_model(tiny_data / "bin", "--label-smoothing-form", form, *fused)
        model.eval()
        sample = _sample(task)
        allowed, target = model.decoder.allowed_types, sample["target"]
        # every gold type one the mask allows (a forbidden one is clamped at MASKED_TARGET_NLL)
        sample["target"] = target.masked_fill(~allowed[target] & target.ne(task.target_dictionary.pad()),
                                              task.target_dictionary.eos())
        with torch.no_grad():
            losses[form] = crit(model, sample)[0]
            lprobs = model.get_normalized_probs(model(**sample["net_input"]), log_probs=True).double()
    target = sample["target"]
    gold = torch.nn.functional.one_hot(target, lprobs.size(-1)).double()
    dist = 0.9 * gold + 0.1 / allowed.sum() * allowed.double()
    rows = -(dist * lprobs.masked_fill(~allowed, 0.0)).sum(-1)
    expected = rows.masked_fill(target.eq(task.target_dictionary.pad()), 0.0).sum()
    assert torch.allclose(losses["uniform"].double(), expected, rtol=1e-5)
    assert not torch.allclose(losses["fairseq"].double(), expected, rtol=1e-5)


def test_fused_loss_rejects_a_prefix(tiny_data):
    with pytest.raises(ValueError, match="--fused-loss does not support --ignore-prefix-size"):
        _criterion_and_model(tiny_data / "bin", "--fused-loss", "--ignore-prefix-size", "1")
