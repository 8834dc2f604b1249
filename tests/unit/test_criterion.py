"""masked_label_smoothed_cross_entropy (qknorm_fairseq/criterion.py) against fairseq's label
smoothing and against the original code's form of it."""
import torch
from fairseq.criterions.label_smoothed_cross_entropy import label_smoothed_nll_loss

from qknorm_fairseq.criterion import masked_label_smoothed_nll_loss


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


def test_the_original_form_differs_by_epsilon_over_n(tmp_path):
    """Both originals put (1 - eps) + eps/N on the gold type and eps/N on each other type (N allowed
    types); fairseq's form, ours, puts 1 - eps on the gold and eps/(N-1) on each other. The loss
    difference is (eps/N) * (mean log p of the others - log p of the gold), 1/N of the smoothing
    term: with a gl->en-sized target vocabulary it is a few 1e-4 nats (docs/training.md)."""
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
    assert torch.allclose(ours, fairseq_form)
    others_mean = (lprobs * (1 - gold)).sum(-1) / (n - 1)
    gold_lp = lprobs[torch.arange(rows), target]
    assert torch.allclose(original - ours, eps / n * (others_mean - gold_lp), atol=1e-12)
    relative = ((original - ours).abs() / ours).max().item()
    assert relative < 1e-3, relative  # negligible: no flag for the original form
