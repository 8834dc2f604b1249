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

On a CPU, fp32 or bf16, each pattern runs as one C loop (csrc/fast_dropout.c, built on first use by
native.py) that draws the same words and applies the mask as it goes, keeping it for the backward
as one byte per unit (ReLU's backward reads the output instead). The same bits as the torch ops
below, in one pass where they take four or five; where no C compiler is found the torch ops run,
with a warning.
"""
import ctypes
import functools
import math

import numpy as np
import torch
from fairseq.modules.fairseq_dropout import FairseqDropout

from . import native


def _seed():
    # a path for CPU tensors only: reading the seed waits for no device
    return torch.randint(0, 2**62, (1,)).tolist()[0]


@torch.compiler.disable  # numpy's memory is no tensor torch.compile can trace
def _cpu_int16(n):
    if n == 0:
        return torch.empty(0, dtype=torch.int16)
    words = np.random.PCG64DXSM(_seed()).random_raw((n + 3) // 4)
    return torch.frombuffer(words, dtype=torch.int16)[:n]


def uniform_int16(n, device=None):
    """N independent draws, uniform over the 65536 int16 values."""
    if device is None or torch.device(device).type == "cpu":
        return _cpu_int16(n)
    bits = torch.randint(-2**31, 2**31 - 1, ((n + 1) // 2,), dtype=torch.int32, device=device)
    return bits.view(torch.int16)[:n]


def threshold(keep):
    """A draw below it keeps its unit."""
    return round(keep * 65536) - 32768


def keep_mask(shape, keep, dtype, device=None):
    """1 / KEEP with probability KEEP (to 1/65536), else 0, in DTYPE."""
    draws = uniform_int16(math.prod(shape), device).view(shape)
    if threshold(keep) > 32767:  # KEEP rounds to 1 (p < 2^-17): every draw keeps, as the C loops compare in int32
        return torch.full(shape, 1.0 / keep, dtype=dtype, device=draws.device)
    # the comparison written as 0 or 1 in DTYPE: one pass, where a bool mask cast to DTYPE takes two
    mask = torch.lt(draws, threshold(keep), out=torch.empty(shape, dtype=dtype, device=draws.device))
    return mask.mul_(1.0 / keep)


MUL, ADD, RELU = range(3)
_SIGNATURES = {
    "qk_seed_state": ([ctypes.c_uint64, ctypes.c_void_p], None),
    "qk_draws": ([ctypes.c_void_p, ctypes.c_int64] + [ctypes.c_uint64] * 4 + [ctypes.c_int], None),
    "qk_dropout_forward": ([ctypes.c_int, ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] + [ctypes.c_uint64] * 4
                           + [ctypes.c_int, ctypes.c_float, ctypes.c_int], None),
    "qk_dropout_backward": ([ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_float, ctypes.c_int], None),
    "qk_relu_dropout_backward": ([ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64, ctypes.c_float, ctypes.c_int],
                                 None),
}


def library():
    """csrc/fast_dropout.c's kernels, or None (a warning, once) where they cannot be built."""
    return native.kernels("fast_dropout", _SIGNATURES, "--fast-dropout", "masks are applied by torch's ops instead "
                          "(the same bits, several passes where the C loop takes one)")


def _native(x, *others):
    """Whether X's dropout runs in the C kernels (OTHERS: tensors read beside X, in X's layout)."""
    return (native.is_enabled() and x.device.type == "cpu" and x.dtype in native.DTYPES and x.is_contiguous()
            and all(t.dtype == x.dtype and t.is_contiguous() and t.shape == x.shape for t in others)
            and library() is not None)


_LOW = 2**64 - 1


def generator_state():
    """The PCG64DXSM state (high and low words of the state, then of the increment) the numpy
    path's generator starts from for the next mask: computed by the C kernels where they are built
    (numpy's seeding, a generator object a call, is several times slower), else by numpy."""
    lib = library()
    if lib is None:
        state = np.random.PCG64DXSM(_seed()).state["state"]
        return (state["state"] >> 64, state["state"] & _LOW, state["inc"] >> 64, state["inc"] & _LOW)
    out = (ctypes.c_uint64 * 4)()
    lib.qk_seed_state(_seed(), out)
    return tuple(out)


@functools.cache
def scale(keep, dtype):
    return torch.tensor(1.0 / keep).to(dtype).item()  # the mask's value: 1 / keep rounded as mul_ rounds it


def kernel(name, *args):
    """Runs the C kernel NAME (one place for step_profile to time them all)."""
    getattr(library(), name)(*args)


def _forward(kind, x, residual, keep):
    """(the output, the kept units as bytes; None for RELU, whose backward reads the output)"""
    y = torch.empty_like(x)
    kept = None if kind == RELU else torch.empty(x.shape, dtype=torch.uint8)
    kernel("qk_dropout_forward", kind, native.DTYPES[x.dtype], x.data_ptr(), native.pointer(residual),
           y.data_ptr(), native.pointer(kept), x.numel(), *generator_state(), threshold(keep),
           scale(keep, x.dtype), native.threads(x.numel()))
    return y, kept


def _backward(name, grad, saved, keep):
    """The gradient of x * mask (NAME qk_dropout_backward, SAVED the kept units) or relu(x) * mask
    (qk_relu_dropout_backward, SAVED the output)."""
    grad = grad.contiguous()
    out = torch.empty_like(grad)
    kernel(name, native.DTYPES[grad.dtype], grad.data_ptr(), saved.data_ptr(), out.data_ptr(), grad.numel(),
           scale(keep, grad.dtype), native.threads(grad.numel()))
    return out


def _masked(ctx, x, residual, p):
    """x * mask, or residual + x * mask (one addcmul) where RESIDUAL is given; saves what
    _masked_grad needs."""
    ctx.keep, ctx.native = 1.0 - p, _native(x, *([] if residual is None else [residual]))
    if ctx.native:
        y, kept = _forward(MUL if residual is None else ADD, x, residual, ctx.keep)
        ctx.save_for_backward(kept)
        return y
    mask = keep_mask(x.shape, ctx.keep, x.dtype, x.device)
    ctx.save_for_backward(mask)
    return x * mask if residual is None else torch.addcmul(residual, x, mask)


def _masked_grad(ctx, grad):
    (saved,) = ctx.saved_tensors
    return _backward("qk_dropout_backward", grad, saved, ctx.keep) if ctx.native else grad * saved


class _Dropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, p):
        return _masked(ctx, x, None, p)

    @staticmethod
    def backward(ctx, grad):
        return _masked_grad(ctx, grad), None


class _DropoutAdd(torch.autograd.Function):
    """residual + dropout(x) in one pass (addcmul): one rounding where x * mask + residual has two."""

    @staticmethod
    def forward(ctx, x, residual, p):
        return _masked(ctx, x, residual, p)

    @staticmethod
    def backward(ctx, grad):
        return _masked_grad(ctx, grad), grad, None


class _ReluDropout(torch.autograd.Function):
    """dropout(relu(x)): the mask applied in place on ReLU's output, and one backward for both, the
    bits of the two ops (where the output is 0, either the mask or ReLU's gradient is)."""

    @staticmethod
    def forward(ctx, x, p):
        ctx.keep, ctx.native = 1.0 - p, _native(x)
        if ctx.native:
            y, _ = _forward(RELU, x, None, ctx.keep)
            ctx.save_for_backward(y)
            return y
        mask = keep_mask(x.shape, ctx.keep, x.dtype, x.device)
        y = torch.relu(x).mul_(mask)
        ctx.save_for_backward(y, mask)
        return y

    @staticmethod
    def backward(ctx, grad):
        if ctx.native:  # where y > 0 the mask was 1 / keep: grad * mask there, no mask needed
            return _backward("qk_relu_dropout_backward", grad, ctx.saved_tensors[0], ctx.keep), None
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

    def draws_mask(self):
        """Whether this dropout draws a mask now (p = 0 and p = 1 need none: x or zeros)."""
        return 0 < self.p < 1 and (self.training or self.apply_during_inference)

    def add(self, x, residual):
        """residual + self(x)"""
        return _DropoutAdd.apply(x, residual, self.p) if self.draws_mask() else residual + self(x)

    def relu(self, x):
        """self(relu(x))"""
        return _ReluDropout.apply(x, self.p) if self.draws_mask() else self(torch.relu(x))


def swap_dropouts(module):
    """Replace every FairseqDropout directly held by MODULE (not its children) by a FastDropout."""
    for name, child in list(module.named_children()):
        if type(child) is FairseqDropout:
            new = FastDropout(child.p, child.module_name)
            new.apply_during_inference = child.apply_during_inference
            setattr(module, name, new)
