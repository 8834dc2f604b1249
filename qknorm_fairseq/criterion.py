"""Label smoothing over the types the model may generate.

With --target-vocab-mask some logits are -inf. fairseq's label_smoothed_cross_entropy spreads
epsilon over the whole vocabulary and sums every log-probability, so its loss becomes inf. This
criterion spreads epsilon over the unmasked types only; with no mask it equals fairseq's.

`--label-smoothing-form uniform` is both original code bases' form: (1 - eps) on the gold type plus
eps/N on each of the N allowed types, the gold included (a uniform distribution mixed in), where
fairseq's form puts 1 - eps on the gold and eps/(N - 1) on each other type.

`--fused-loss` computes the same loss and its gradient from the logits, a block of rows at a time
in fp32, instead of through fp32 log-probabilities of all tokens x types (a cast, log_softmax, the
smoothing sum and their backward: about ten passes over the largest tensor of an update). With
--fused-kernels each of its two passes is one compiled loop (fused_kernels.py).
"""
from dataclasses import dataclass, field

import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)
from fairseq.dataclass import ChoiceEnum

from .decoder_rows import packed_extra

NAME = "masked_label_smoothed_cross_entropy"

# A reference token the mask forbids (possible only in valid/test data) costs this many nats
# instead of inf, so validation losses stay finite.
MASKED_TARGET_NLL = 100.0

# --fused-loss works on blocks of about this many logits (4 MiB in fp32), so that a block's fp32
# copy is still in cache when the next op reads it
FUSED_BLOCK = 1 << 20


def _row_blocks(rows, types):
    step = max(1, FUSED_BLOCK // types)
    return (slice(s, s + step) for s in range(0, rows, step))


def smoothing_weights(epsilon, n, uniform):
    """(weight of the gold type's nll, weight of the sum over the N allowed types' -log p) in the
    loss: the two forms of label smoothing (module docstring)."""
    eps_i = epsilon / n if uniform else epsilon / (n - 1)
    return (1.0 - epsilon if uniform else 1.0 - epsilon - eps_i), eps_i


def masked_label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=None, reduce=True, allowed=None,
                                   uniform=False):
    """ALLOWED: bool (V,), the types the model may generate (the decoder's mask); without it, the
    finite entries of LPROBS, found with an isfinite over all of them. UNIFORM: the original code
    bases' form of the smoothing, else fairseq's."""
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(-1)
    if allowed is None:
        allowed = torch.isfinite(lprobs)
    nll_loss = -lprobs.gather(dim=-1, index=target)
    nll_loss = nll_loss.masked_fill(nll_loss == float("inf"), MASKED_TARGET_NLL)  # forbidden targets only
    smooth_loss = -lprobs.masked_fill(~allowed, 0.0).sum(dim=-1, keepdim=True)
    n_allowed = allowed.sum(dim=-1, keepdim=True).to(lprobs.dtype)
    if ignore_index is not None:
        pad_mask = target.eq(ignore_index)
        nll_loss = nll_loss.masked_fill(pad_mask, 0.0)
        smooth_loss = smooth_loss.masked_fill(pad_mask, 0.0)
    gold, eps_i = smoothing_weights(epsilon, n_allowed, uniform)
    loss = gold * nll_loss + eps_i * smooth_loss
    if reduce:
        return loss.sum(), nll_loss.sum()
    return loss.squeeze(-1), nll_loss.squeeze(-1)


def _blocked_statistics(logits, target, forbidden, acc):
    """Per row of LOGITS, in ACC: logsumexp, the target's logit, the sum of the allowed logits."""
    rows, types = logits.shape
    lse, tgt, total = (logits.new_empty(rows, dtype=acc) for _ in range(3))
    for b in _row_blocks(rows, types):
        # a copy only to mask in place or to cast (a fresh block is page faults, not just a pass)
        x = logits[b].to(acc, copy=forbidden is not None)
        torch.logsumexp(x, dim=-1, out=lse[b])
        tgt[b] = x.gather(-1, target[b, None]).squeeze(-1)
        if forbidden is not None:
            x.masked_fill_(forbidden, 0.0)  # the masked logits are -inf
        torch.sum(x, dim=-1, out=total[b])
    return lse, tgt, total


class FusedLabelSmoothedNLL(torch.autograd.Function):
    """(loss sum, nll sum) of masked_label_smoothed_nll_loss(log_softmax(LOGITS), ...), reduced,
    straight from LOGITS (N, V) of any float dtype; ALLOWED: bool (V,) or None (every type); UNIFORM
    as there.

    With lse = logsumexp of a row, nll = lse - logit[target] and smooth = n * lse - (sum of the
    allowed logits); the gradient of a row is softmax * (c_nll + n c_smooth) - c_nll onehot(target)
    - c_smooth allowed, where c_nll and c_smooth are the weights of nll and smooth in the loss.
    KERNELS: fused_kernels' compiled loops instead of blocks of eager ops."""

    @staticmethod
    def forward(ctx, logits, target, epsilon, ignore_index, allowed, uniform, kernels=False):
        rows, types = logits.shape
        acc = torch.promote_types(logits.dtype, torch.float32)  # fp32, or fp64 for fp64 logits
        # in acc, never in the logits' dtype: bf16 would round 3172 types to 3168
        # filled on the logits' device: no host-to-device copy
        n = allowed.sum().to(acc) if allowed is not None else logits.new_full((), float(types), dtype=acc)
        gold, eps_i = smoothing_weights(epsilon, n, uniform)
        if not torch.is_tensor(gold):  # a float in the uniform form
            gold = logits.new_full((), gold, dtype=acc)
        forbidden = ~allowed if allowed is not None else None
        if kernels:
            from .fused_kernels import loss_statistics

            lse, tgt, total = loss_statistics(logits, target, forbidden)
        else:
            lse, tgt, total = _blocked_statistics(logits, target, forbidden, acc)
        weights = allowed.to(acc) if allowed is not None else None
        nll = lse - tgt
        live = nll != float("inf")  # a forbidden target's nll is a constant there: no gradient
        nll = nll.masked_fill(~live, MASKED_TARGET_NLL)
        smooth = n * lse - total
        keep = target.ne(ignore_index) if ignore_index is not None else torch.ones_like(live)
        nll, smooth = nll * keep, smooth * keep
        ctx.save_for_backward(logits, target, lse, live & keep, keep, weights, n, gold, eps_i)
        ctx.kernels = kernels
        loss = gold * nll + eps_i * smooth
        return loss.sum(), nll.sum()

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        logits, target, lse, live, keep, weights, n, gold, eps_i = ctx.saved_tensors
        rows, types = logits.shape
        c_nll = (grad_loss * gold + grad_nll) * live
        c_smooth = grad_loss * eps_i * keep
        c_softmax = c_nll + n * c_smooth
        if ctx.kernels:
            from .fused_kernels import loss_gradient

            grad = loss_gradient(logits, lse, c_softmax, target, c_nll, c_smooth, weights)
            return grad, None, None, None, None, None, None
        c_softmax = c_softmax[:, None]
        grad = torch.empty_like(logits)
        in_place = grad.dtype == lse.dtype  # fp32 logits: the block is computed where it is returned
        for b in _row_blocks(rows, types):
            # softmax * c_softmax - c_nll onehot - c_smooth allowed, in place on an fp32 block
            g = torch.sub(logits[b], lse[b, None], out=grad[b]) if in_place else logits[b].to(lse.dtype).sub_(lse[b, None])
            g.exp_().mul_(c_softmax[b])
            g.scatter_add_(-1, target[b, None], -c_nll[b, None])
            if weights is None:
                g.sub_(c_smooth[b, None])
            else:
                g.addr_(c_smooth[b], weights, alpha=-1)
            if not in_place:
                grad[b] = g
        return grad, None, None, None, None, None, None


@dataclass
class MaskedLabelSmoothedCrossEntropyConfig(LabelSmoothedCrossEntropyCriterionConfig):
    fused_loss: bool = field(default=False, metadata={
        "help": "the loss and its gradient straight from the logits, in fp32 blocks of rows, without "
                "log-probabilities of every token (the same loss up to rounding; faster on a CPU, not "
                "measured on a GPU)"})
    label_smoothing_form: ChoiceEnum(["fairseq", "uniform"]) = field(default="fairseq", metadata={
        "help": "fairseq: 1 - eps on the gold type, eps/(N-1) on each other allowed type; uniform: both original "
                "code bases' form, 1 - eps + eps/N on the gold and eps/N on each other (N allowed types)"})


@register_criterion(NAME, dataclass=MaskedLabelSmoothedCrossEntropyConfig)
class MaskedLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def __init__(self, task, sentence_avg, label_smoothing, ignore_prefix_size=0, report_accuracy=False,
                 fused_loss=False, label_smoothing_form="fairseq"):
        super().__init__(task, sentence_avg, label_smoothing, ignore_prefix_size, report_accuracy)
        if fused_loss and ignore_prefix_size:
            raise ValueError("--fused-loss does not support --ignore-prefix-size; drop one of them")
        self.fused_loss = fused_loss
        self.uniform = label_smoothing_form == "uniform"

    def compute_loss(self, model, net_output, sample, reduce=True):
        if self.ignore_prefix_size and "packed_rows" in packed_extra(net_output):
            raise ValueError("--packed-decoder returns no (sentence, position) grid for --ignore-prefix-size to cut: "
                             "drop one of them")
        decoder = getattr(model, "decoder", None)
        ours = getattr(decoder, "mask_output", None) is not None
        # our decoder: its mask (or none) says which log-probabilities are -inf, so no isfinite over
        # all tokens x types is needed; --packed-decoder's logits may hold the allowed types only
        # (N, V'), their targets then columns, none of them padding
        packed_types = "packed_types" in packed_extra(net_output)
        allowed = decoder.allowed_types if ours and decoder.mask_output and not packed_types else None
        ignore = None if packed_types else self.padding_idx
        if self.fused_loss and reduce:
            if getattr(decoder, "adaptive_softmax", None) is not None:
                raise ValueError("--fused-loss needs log-probabilities that are log_softmax(logits); "
                                 "drop --fused-loss or the adaptive softmax")
            logits, target = net_output[0], model.get_targets(sample, net_output)
            # allowed None: every type (a decoder that is not ours never masks its logits)
            kernels = getattr(decoder, "fused_kernels", False) and model.training
            return FusedLabelSmoothedNLL.apply(logits.view(-1, logits.size(-1)), target.view(-1), self.eps,
                                               ignore, allowed, self.uniform, kernels)
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        if ours and allowed is None:
            allowed = torch.ones_like(lprobs[0], dtype=torch.bool)
        return masked_label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=ignore, reduce=reduce,
                                              allowed=allowed, uniform=self.uniform)

    def compute_accuracy(self, model, net_output, sample):
        if "packed_types" not in packed_extra(net_output):
            return super().compute_accuracy(model, net_output, sample)
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)  # no padding among them
        return lprobs.argmax(1).eq(target).sum(), torch.tensor(target.numel())
