"""The C loops' row sums (csrc/common.h's LANE_SUM, and ROWS_LANE_SUM, which ends many rows' sums side by
side) in their one order: each row's terms into 16 fp32 partial sums by position mod 16, a tail into the
first, the partial sums then added in lane order. Recomputed here in numpy's fp32, one operation at a
time, for row counts and widths that leave partial blocks and tails: the bits must match."""
import numpy as np
import pytest
import torch

from qknorm_fairseq import fused_kernels, native

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")

f32 = np.float32


def lane_sum(terms):
    """TERMS (rows, d) float32 -> each row's sum in the C loops' order"""
    rows, d = terms.shape
    lanes = np.zeros((rows, 16), dtype=f32)
    full = d // 16 * 16
    for i in range(0, full, 16):
        lanes = lanes + terms[:, i:i + 16]
    for i in range(full, d):
        lanes[:, 0] = lanes[:, 0] + terms[:, i]
    total = np.zeros(rows, dtype=f32)
    for k in range(16):
        total = total + lanes[:, k]
    return total


@pytest.mark.parametrize("rows, d", [(37, 40), (16, 64), (3, 7), (50, 256)])
def test_l2_normalisation_sums_each_row_in_lane_order(rows, d):
    x = torch.randn(rows, 1, d, generator=torch.Generator().manual_seed(rows))
    y = fused_kernels.lp_normalize(x, 2, 1e-6).squeeze(1).numpy()
    v = x.squeeze(1).numpy()
    s = lane_sum(v * v)
    r = f32(1) / np.sqrt(np.maximum(s, f32(1e-12)))
    assert np.array_equal(y, v * r[:, None])


@pytest.mark.parametrize("rows, d", [(37, 40), (21, 256)])
def test_layer_norm_sums_each_row_in_lane_order(rows, d):
    g = torch.Generator().manual_seed(d)
    x, w, b = torch.randn(rows, d, generator=g) * 3 + 1, torch.rand(d, generator=g) + 0.5, torch.randn(d, generator=g)
    h = fused_kernels.layer_norm(x, w, b, 1e-5).numpy()
    v, wn, bn = x.numpy(), w.numpy(), b.numpy()
    mean = lane_sum(v) / f32(d)
    c = v - mean[:, None]
    r = f32(1) / np.sqrt(lane_sum(c * c) / f32(d) + f32(1e-5))
    assert np.array_equal(h, c * r[:, None] * wn + bn)
