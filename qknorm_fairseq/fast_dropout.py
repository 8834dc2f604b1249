"""`--fast-dropout`: dropout masks from 16-bit random draws instead of torch's bernoulli_.

On a CPU torch's dropout draws its mask with `bernoulli_`, several times slower than drawing
uniform numbers: with the TwT recipe's dropout on attention weights and ReLU outputs, 37% of a
gl->en training update (bf16, d = 256, profiled with torch.profiler) went into it. Here a unit is
kept when a uniform 16-bit draw falls below round(65536 (1 - p)) (keep probability exact to
1/65536), and the mask is stored as 0 or 1 / (1 - p) in the activations' dtype, so forward and
backward are one multiplication each (`bash scripts/benchmark.sh kernels` times it against torch's).
The draws: on a CPU four per 64-bit word of numpy's PCG64DXSM generator, seeded for every mask from
torch's generator (so torch.manual_seed, which fairseq calls at every update, fixes them); on a GPU
two per 32-bit word of that device's torch generator. The random stream differs from torch's
dropout, so a run with the flag is not the bit-for-bit twin of one without it; off by default.

Two sublayer patterns go through one autograd function each, for fewer passes over memory: the
dropout of a sublayer's output with its residual addition (`residual + dropout(x)` as one
addcmul, rounded once where the two ops round twice) and ReLU with the dropout after it (the same
bits as the two ops).
"""
import math

import numpy as np
import torch
from fairseq.modules.fairseq_dropout import FairseqDropout


@torch.compiler.disable  # numpy's memory is no tensor torch.compile can trace
def _cpu_int16(n):
    if n == 0:
        return torch.empty(0, dtype=torch.int16)
    # a path for CPU tensors only: reading the seed and wrapping numpy's memory wait for no device
    seed = torch.randint(0, 2**62, (1,)).tolist()[0]
    words = np.random.PCG64DXSM(seed).random_raw((n + 3) // 4)
    return torch.frombuffer(words, dtype=torch.int16)[:n]


def uniform_int16(n, device=None):
    """N independent draws, uniform over the 65536 int16 values."""
    if device is None or torch.device(device).type == "cpu":
        return _cpu_int16(n)
    bits = torch.randint(-2**31, 2**31 - 1, ((n + 1) // 2,), dtype=torch.int32, device=device)
    return bits.view(torch.int16)[:n]


def keep_mask(shape, keep, dtype, device=None):
    """1 / KEEP with probability KEEP (to 1/65536), else 0, in DTYPE."""
    draws = uniform_int16(math.prod(shape), device).view(shape)
    # the comparison written as 0 or 1 in DTYPE: one pass, where a bool mask cast to DTYPE takes two
    mask = torch.lt(draws, round(keep * 65536) - 32768, out=torch.empty(shape, dtype=dtype, device=draws.device))
    return mask.mul_(1.0 / keep)


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        mask = keep_mask(x.shape, 1.0 - p, x.dtype, x.device)
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, None


class _DropoutAdd(torch.autograd.Function):
    """residual + dropout(x) in one pass (addcmul): one rounding where x * mask + residual has two."""

    @staticmethod
    def forward(ctx, x, residual, p):
        mask = keep_mask(x.shape, 1.0 - p, x.dtype, x.device)
        ctx.save_for_backward(mask)
        return torch.addcmul(residual, x, mask)

    @staticmethod
    def backward(ctx, grad):
        (mask,) = ctx.saved_tensors
        return grad * mask, grad, None


class _ReluDropout(torch.autograd.Function):
    """dropout(relu(x)): the mask applied in place on ReLU's output, and one backward for both, the
    bits of the two ops (where the output is 0, either the mask or ReLU's gradient is)."""

    @staticmethod
    def forward(ctx, x, p):
        mask = keep_mask(x.shape, 1.0 - p, x.dtype, x.device)
        y = torch.relu(x).mul_(mask)
        ctx.save_for_backward(y, mask)
        return y

    @staticmethod
    def backward(ctx, grad):
        y, mask = ctx.saved_tensors
        return torch.ops.aten.threshold_backward(grad * mask, y, 0), None


def fast_dropout(x, p, training=True):
    if not training or p == 0:
        return x
    if p == 1:
        return torch.zeros_like(x)
    return _Dropout.apply(x, p)


class FastDropout(FairseqDropout):
    """FairseqDropout with the mask drawn by fast_dropout; `add` and `relu` are its two fused patterns."""

    def forward(self, x, inplace: bool = False):
        return fast_dropout(x, self.p, self.training or self.apply_during_inference)

    def _draws_mask(self):
        # p = 0 and p = 1 need no mask: fast_dropout returns x or zeros
        return 0 < self.p < 1 and (self.training or self.apply_during_inference)

    def add(self, x, residual):
        """residual + self(x)"""
        return _DropoutAdd.apply(x, residual, self.p) if self._draws_mask() else residual + self(x)

    def relu(self, x):
        """self(relu(x))"""
        return _ReluDropout.apply(x, self.p) if self._draws_mask() else self(torch.relu(x))


def swap_dropouts(module):
    """Replace every FairseqDropout directly held by MODULE (not its children) by a FastDropout."""
    for name, child in list(module.named_children()):
        if type(child) is FairseqDropout:
            new = FastDropout(child.p, child.module_name)
            new.apply_during_inference = child.apply_during_inference
            setattr(module, name, new)
