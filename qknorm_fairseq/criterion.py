"""Label smoothing over the types the model may generate.

With --target-vocab-mask some logits are -inf. fairseq's label_smoothed_cross_entropy spreads
epsilon over the whole vocabulary and sums every log-probability, so its loss becomes inf. This
criterion spreads epsilon over the unmasked types only; with no mask it equals fairseq's.
"""
import torch
from fairseq.criterions import register_criterion
from fairseq.criterions.label_smoothed_cross_entropy import (
    LabelSmoothedCrossEntropyCriterion,
    LabelSmoothedCrossEntropyCriterionConfig,
)

# A reference token the mask forbids (possible only in valid/test data) costs this many nats
# instead of inf, so validation losses stay finite.
MASKED_TARGET_NLL = 100.0


def masked_label_smoothed_nll_loss(lprobs, target, epsilon, ignore_index=None, reduce=True, allowed=None):
    """ALLOWED: bool (V,), the types the model may generate (the decoder's mask); without it, the
    finite entries of LPROBS, found with an isfinite over all of them."""
    if target.dim() == lprobs.dim() - 1:
        target = target.unsqueeze(-1)
    if allowed is None:
        allowed = torch.isfinite(lprobs)
    nll_loss = -lprobs.gather(dim=-1, index=target).clamp(min=-MASKED_TARGET_NLL)
    smooth_loss = -lprobs.masked_fill(~allowed, 0.0).sum(dim=-1, keepdim=True)
    n_allowed = allowed.sum(dim=-1, keepdim=True).to(lprobs.dtype)
    if ignore_index is not None:
        pad_mask = target.eq(ignore_index)
        nll_loss = nll_loss.masked_fill(pad_mask, 0.0)
        smooth_loss = smooth_loss.masked_fill(pad_mask, 0.0)
    eps_i = epsilon / (n_allowed - 1)
    loss = (1.0 - epsilon - eps_i) * nll_loss + eps_i * smooth_loss
    if reduce:
        return loss.sum(), nll_loss.sum()
    return loss.squeeze(-1), nll_loss.squeeze(-1)


@register_criterion("masked_label_smoothed_cross_entropy", dataclass=LabelSmoothedCrossEntropyCriterionConfig)
class MaskedLabelSmoothedCrossEntropyCriterion(LabelSmoothedCrossEntropyCriterion):
    def compute_loss(self, model, net_output, sample, reduce=True):
        lprobs, target = self.get_lprobs_and_target(model, net_output, sample)
        decoder = getattr(model, "decoder", None)
        if getattr(decoder, "mask_output", None) is not None:
            # our decoder: its mask (or none) says which log-probabilities are -inf, so no isfinite
            # over all tokens x types is needed
            allowed = decoder.allowed_types if decoder.mask_output else torch.ones_like(lprobs[0], dtype=torch.bool)
        else:
            allowed = None
        return masked_label_smoothed_nll_loss(lprobs, target, self.eps, ignore_index=self.padding_idx, reduce=reduce,
                                              allowed=allowed)
