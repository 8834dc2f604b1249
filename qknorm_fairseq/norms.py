"""Normalisation layers: LayerNorm, ScaleNorm and RMSNorm behind one builder.

ScaleNorm (Nguyen & Salazar 2019): g * x / max(||x||_2, eps) with one learned scalar g,
initialised to sqrt(d). RMSNorm (Zhang & Sennrich 2019): x / rms(x) with per-unit gains.
"""
import math

import torch
import torch.nn as nn
from fairseq.modules import LayerNorm

NORM_TYPES = ("layernorm", "scalenorm", "rmsnorm")


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
        norm = torch.linalg.vector_norm(x.float(), dim=-1, keepdim=True).clamp(min=self.eps)
        return (self.g * x.float() / norm).type_as(x)

    def extra_repr(self):
        return f"g={float(self.g):.3f}, learnable={isinstance(self.g, nn.Parameter)}"


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight * y).type_as(x)


def build_norm(norm_type, dim, learnable_scale=True):
    """The one place that maps --norm-type to a module."""
    if norm_type == "layernorm":
        return LayerNorm(dim)
    if norm_type == "scalenorm":
        return ScaleNorm(dim, learnable=learnable_scale)
    if norm_type == "rmsnorm":
        return RMSNorm(dim)
    raise ValueError(f"unknown --norm-type {norm_type!r}; choose one of {', '.join(NORM_TYPES)}")
