"""Normalisation layers: LayerNorm, ScaleNorm and RMSNorm, by name (`--norm-type`) in NORMS; and
l2_normalize, the x / max(||x||_2, eps) of QKNorm's queries and keys and of FixNorm's embeddings.

ScaleNorm (Nguyen & Salazar 2019): g * x / max(||x||_2, eps) with one learned scalar g,
initialised to sqrt(d). RMSNorm (Zhang & Sennrich 2019): x / rms(x) with per-unit gains.
"""
import math

import torch
import torch.nn as nn


class _ScaleNormFunction(torch.autograd.Function):
    """g * x / max(||x||, eps) with a hand-written backward: autograd's chain through norm, clamp,
    division and product ran 2.5x slower than LayerNorm's fused kernel on CPU
    (`python -m qknorm_pipeline.benchmark kernels`)."""

    @staticmethod
    def forward(ctx, x, g, eps):
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        inv = norm.clamp(min=eps).reciprocal_()
        xhat = x * inv
        ctx.save_for_backward(xhat, inv, g, norm >= eps)
        return xhat * g

    @staticmethod
    def backward(ctx, dy):
        xhat, inv, g, unclamped = ctx.saved_tensors
        dot = (dy * xhat).sum(-1, keepdim=True)
        # d(x/||x||) projects out the radial part; where the norm was clamped, 1/eps is a constant
        dx = torch.addcmul(dy, xhat, dot * unclamped, value=-1).mul_(inv * g)
        dg = dot.sum().reshape(g.shape) if ctx.needs_input_grad[1] else None
        return dx, dg, None


def _fp32_norm(x):
    # fp64 stays fp64 (gradcheck); chosen in Python, as torch.promote_types is a dispatched op
    dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    return torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=dtype)


class _L2NormalizeFunction(torch.autograd.Function):
    """x / max(||x||, eps) in fp32 (at least), cast back to x's dtype, with a hand-written backward
    that does autograd's arithmetic on the plain ops, rounding for rounding (the gradients are the
    same bits), in 11 ATen ops (12 for bf16 x) where autograd's chain through the division, clamp and
    norm dispatches 16 (19); a QKNorm preset has 19 of these per update."""

    @staticmethod
    def forward(ctx, x, eps):
        norm = _fp32_norm(x)
        clamped = norm.clamp(min=eps)
        y = x / clamped
        ctx.save_for_backward(y, clamped, norm)
        ctx.eps, ctx.dtype = eps, x.dtype
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx, dy):
        y, clamped, norm = ctx.saved_tensors
        # autograd's order: d/dx of x / c, and d/dc = -g * ((x / c) / c) summed, zero where clamped,
        # through the norm as (x / ||x||) * d/dc, where x / ||x|| is y wherever it is not clamped.
        # g is dy in fp32: an op with fp32 operands promotes a half-precision dy exactly, as a cast would.
        g = dy
        d_self = (g / clamped).to(ctx.dtype)
        d_norm = (-g * (y / clamped)).sum(-1, keepdim=True).masked_fill_(norm < ctx.eps, 0)
        return d_self.add_((y * d_norm).to(ctx.dtype)), None


def l2_normalize(x, eps):
    """x / max(||x||_2, eps) along the last dim, computed in fp32 and returned in x's dtype; with
    _L2NormalizeFunction's backward where one is needed."""
    if torch.is_grad_enabled() and x.requires_grad:
        return _L2NormalizeFunction.apply(x, eps)
    return (x / _fp32_norm(x).clamp(min=eps)).to(x.dtype)


class _RMSNormFunction(torch.autograd.Function):
    """w * x / sqrt(mean(x^2) + eps) with a hand-written backward (as _ScaleNormFunction)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        rstd = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
        xhat = x * rstd
        ctx.save_for_backward(xhat, rstd, weight)
        return xhat * weight

    @staticmethod
    def backward(ctx, dy):
        xhat, rstd, weight = ctx.saved_tensors
        dxhat = dy * weight
        dx = torch.addcmul(dxhat, xhat, (dxhat * xhat).mean(-1, keepdim=True), value=-1).mul_(rstd)
        dw = (dy * xhat).reshape(-1, xhat.size(-1)).sum(0) if ctx.needs_input_grad[1] else None
        return dx, dw, None


class ScaleNorm(nn.Module):
    def __init__(self, dim, eps=1e-5, learnable=True):
        super().__init__()
        self.eps = eps
        g = torch.tensor(math.sqrt(dim))
        if learnable:
            self.g = nn.Parameter(g)
        else:  # TwT Table 7, "fixed g": the scale stays at sqrt(d)
            self.register_buffer("g", g)

    def forward(self, x):
        return _ScaleNormFunction.apply(x.float(), self.g.float(), self.eps).type_as(x)

    def extra_repr(self):
        return f"g={self.g.detach().item():.3f}, learnable={isinstance(self.g, nn.Parameter)}"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        return _RMSNormFunction.apply(x.float(), self.weight.float(), self.eps).type_as(x)


# --norm-type NAME -> builder(dim, learnable_scale); None: fairseq's own LayerNorm, left in place
NORMS = {
    "layernorm": None,
    "scalenorm": lambda dim, learnable_scale: ScaleNorm(dim, learnable=learnable_scale),
    "rmsnorm": lambda dim, learnable_scale: RMSNorm(dim),
}
