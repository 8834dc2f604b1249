"""--fused-kernels on a CPU with AMX: a bf16 linear layer's weight and bias gradients in one pass (csrc/weight_grad.c)."""
import copy
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from qknorm_fairseq import fused_kernels, native

from helpers import torch_threads


def _amx():
    return native.compiler() is not None and fused_kernels._weight_grad_library() is not None


pytestmark = pytest.mark.skipif(not _amx(), reason="needs a C compiler and a CPU with AMX-BF16 (elsewhere torch's "
                                                   "product and sum run, as test_rows_linear checks)")

# (tokens, out, in): the study's projections and feed-forward layers, odd tile counts, tokens not a multiple of 32
SHAPES = [(2304, 256, 256), (1664, 1024, 256), (1664, 256, 1024), (300, 80, 48), (37, 16, 48), (1, 32, 16), (129, 48, 16)]


def _inputs(n, out, inputs, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, out, generator=g).bfloat16(), torch.randn(n, inputs, generator=g).bfloat16()


def _bound(terms_abs, exact, n):
    # an fp32 sum of n products of bf16 (exact in fp32) is within gamma = n 2^-24 sum |terms| of the exact sum s;
    # rounding it once to bf16 adds at most 2^-8 of its magnitude (half a unit in bf16's 8th bit)
    gamma = 1.01 * n * 2.0 ** -24 * terms_abs
    return 2.0 ** -8 * (exact.abs() + gamma) + gamma


@pytest.mark.parametrize("n,out,inputs", SHAPES)
def test_gradients_are_an_fp32_sum_of_the_exact_products_rounded_once(n, out, inputs):
    """dw = dy^T x and db = dy's column sums against fp64: within an fp32 sum's error and one bf16 rounding,
    through the C kernel (not torch's product)."""
    dy, x = _inputs(n, out, inputs)
    lib = fused_kernels._weight_grad_library()
    with mock.patch.object(lib, "qk_weight_grad", wraps=lib.qk_weight_grad) as kernel:
        dw, db = fused_kernels.weight_grads(dy, x)
    assert kernel.call_count == 1 and dw.dtype == db.dtype == torch.bfloat16
    exact, exact_b = dy.double().t() @ x.double(), dy.double().sum(0)
    assert ((dw.double() - exact).abs() <= _bound(dy.double().abs().t() @ x.double().abs(), exact, n)).all()
    assert ((db.double() - exact_b).abs() <= _bound(dy.double().abs().sum(0), exact_b, n)).all()


def test_a_wrong_layout_fails_the_bound():
    """The bound above catches a transposed operand's pairing: dy's rows shifted by one token give other sums."""
    dy, x = _inputs(256, 32, 32)
    dw, _ = fused_kernels.weight_grads(dy.roll(1, 0), x)
    exact = dy.double().t() @ x.double()
    assert not ((dw.double() - exact).abs() <= _bound(dy.double().abs().t() @ x.double().abs(), exact, 256)).all()


def test_bits_do_not_depend_on_the_threads():
    """Each output is summed over the tokens in order by one thread: 1, 2 and 3 threads give the same bits."""
    dy, x = _inputs(1000, 1024, 256, seed=1)
    results = []
    for threads in (1, 2, 3):
        with torch_threads(threads):
            results += [fused_kernels.weight_grads(dy, x), fused_kernels.weight_grads(x, dy)]
    for i in range(2, len(results)):
        assert all(torch.equal(a, b) for a, b in zip(results[i % 2], results[i]))


def test_other_inputs_run_torchs_product_and_sum():
    """Widths not a multiple of 16, fp32 rows, no tokens, no weight gradient wanted, and the portable build: torch's bits,
    the kernel not called; the weight's gradient alone (no bias gradient wanted) from the kernel, the same bits."""
    dy, x = _inputs(300, 96, 64)
    lib = fused_kernels._weight_grad_library()
    with mock.patch.object(lib, "qk_weight_grad", wraps=lib.qk_weight_grad) as kernel:
        for a, b in ((dy[:, :90], x), (dy, x[:, :40]), (dy.float(), x.float()), (dy[:0], x[:0])):
            dw, db = fused_kernels.weight_grads(a, b)
            assert torch.equal(dw, a.t().mm(b)) and torch.equal(db, a.sum(0))
        dw, db = fused_kernels.weight_grads(dy, x, weight=False)
        assert dw is None and torch.equal(db, dy.sum(0))
        assert kernel.call_count == 0
        with native.portable_loops():
            dw, db = fused_kernels.weight_grads(dy, x)
            assert fused_kernels._weight_grad_library() is None
        assert native.load("weight_grad", portable=True).qk_weight_grad_ready() == 0  # built, without AMX
        assert torch.equal(dw, dy.t().mm(x)) and torch.equal(db, dy.sum(0)) and kernel.call_count == 0
        dw_only, db_none = fused_kernels.weight_grads(dy, x, bias=False)
        assert db_none is None and torch.equal(dw_only, fused_kernels.weight_grads(dy, x)[0]) and kernel.call_count == 2


def test_nan_and_infinity_reach_their_rows():
    """A NaN in dy makes its column's weight-gradient row and bias entry NaN; an infinity in x its column's."""
    dy, x = _inputs(64, 32, 48)
    dy[5, 3], x[7, 9] = float("nan"), float("inf")
    dw, db = fused_kernels.weight_grads(dy, x)
    assert dw[3].isnan().all() and db[3].isnan() and not db[torch.arange(32) != 3].isnan().any()
    assert (dw[torch.arange(32) != 3, 9].isinf() | dw[torch.arange(32) != 3, 9].isnan()).all()


def test_a_linear_layer_trains_through_the_kernel():
    """RowsLinear's weight and bias gradients are the kernel's; its output and input gradient F.linear's bits."""
    torch.manual_seed(0)
    plain = torch.nn.Linear(256, 1024).bfloat16()
    rows = fused_kernels.RowsLinear.swap(copy.deepcopy(plain))
    x0, dy = torch.randn(700, 256).bfloat16(), torch.randn(700, 1024).bfloat16()
    grads = []
    for module in (plain, rows):
        x = x0.clone().requires_grad_()
        y = module(x)
        y.backward(dy)
        grads.append((y, x.grad, module.weight.grad, module.bias.grad))
    assert torch.equal(grads[0][0], grads[1][0]) and torch.equal(grads[0][1], grads[1][1])
    dw, db = fused_kernels.weight_grads(dy, x0)
    assert torch.equal(grads[1][2], dw) and torch.equal(grads[1][3], db)


def test_onednn_held_below_amx_keeps_the_kernel_out():
    """ONEDNN_MAX_CPU_ISA below AMX (a stand-in for an older CPU) turns the kernel off as it turns off oneDNN's
    AMX products; an AMX level keeps it."""
    code = "from qknorm_fairseq import fused_kernels as f; print(f._weight_grad_library() is not None)"
    for isa, expected in (("AVX512_CORE_BF16", "False"), ("AVX512_CORE_AMX", "True")):
        p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={**os.environ, "ONEDNN_MAX_CPU_ISA": isa})
        assert p.returncode == 0 and p.stdout.strip() == expected, (isa, p.stderr[-2000:])
