"""--fused-kernels' RowsLinear: the projections' and feed-forward layers' bias added inside oneDNN's product."""
import copy
import os
import subprocess
import sys
from unittest import mock

import pytest
import torch

from qknorm_fairseq.fused_kernels import RowsLinear, _linear_pointwise


def test_rows_linear_gives_torchs_bits_and_keeps_the_module():
    """RowsLinear (--fused-kernels' projections and feed-forward layers): oneDNN's product with the bias in
    it gives F.linear's bits, forward and backward (the weight's and bias's gradients as torch's product and sum,
    as on a CPU without AMX; with AMX test_weight_grad checks them), on bf16 rows; other inputs run F.linear itself."""
    if _linear_pointwise() is None:
        pytest.skip("this torch has no mkldnn _linear_pointwise")
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, 96).bfloat16()
    rows = RowsLinear.swap(copy.deepcopy(plain))
    assert type(rows) is RowsLinear and rows.state_dict().keys() == plain.state_dict().keys()
    x0 = torch.randn(300, 64).bfloat16()
    dy = torch.randn(300, 96).bfloat16()
    results = []
    for module in (plain, rows):
        x = x0.clone().requires_grad_()
        with mock.patch("qknorm_fairseq.fused_kernels._weight_grad_library", return_value=None):
            y = module(x)
            y.backward(dy)
        results.append((y, x.grad, module.weight.grad, module.bias.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    called = []
    with mock.patch("qknorm_fairseq.fused_kernels._BiasLinears.apply", side_effect=lambda *a: called.append(1) or a[:1]):
        rows(x0)
        rows(x0.float().view(3, 100, 64).bfloat16())  # not rows: F.linear
        rows.eval()
        rows(x0)
    assert called == [1]


def test_without_onednns_bf16_kernels_the_linear_layers_run_addmm_with_a_warning():
    """Under ONEDNN_MAX_CPU_ISA=AVX2 (the demo's `cpu.isa: avx2`) oneDNN has no bf16 linear with a bias:
    the probe says so once, and RowsLinear trains through F.linear."""
    code = ("import logging, torch; logging.basicConfig(); from qknorm_fairseq.fused_kernels import RowsLinear, "
            "_linear_pointwise; assert _linear_pointwise() is None; m = RowsLinear.swap(torch.nn.Linear(8, 4).bfloat16()); "
            "m(torch.randn(5, 8).bfloat16().requires_grad_()).sum().backward(); print('trained')")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "ONEDNN_MAX_CPU_ISA": "AVX2"})
    assert p.returncode == 0 and p.stdout.strip() == "trained", p.stderr[-2000:]
    assert p.stderr.count("--fused-kernels: oneDNN has no bf16 linear with the bias inside the product here; bf16 "
                          "linear layers run as torch's addmm (the same bits, one more pass; docs/performance.md)") == 1


def test_layers_of_one_input_sum_its_gradient_inside_the_products():
    """linears() (attention's q, k and v projections of one input): each output and each weight's and bias's gradient
    F.linear's bits; the input's gradient, the sum of dy_i W_i, against fp64 at least as close as autograd's sum of
    the layers' rounded gradients, and not its bits; fp32 rows and eval mode: the layers themselves."""
    from qknorm_fairseq.fused_kernels import _BiasLinears, linears

    if _linear_pointwise() is None:
        pytest.skip("this torch has no mkldnn _linear_pointwise")
    torch.manual_seed(1)
    plain = [torch.nn.Linear(64, 96).bfloat16() for _ in range(3)]
    rows = [RowsLinear.swap(copy.deepcopy(layer)) for layer in plain]
    x0 = torch.randn(300, 64).bfloat16()
    dys = [torch.randn(300, 96).bfloat16() for _ in range(3)]
    results = []
    for layers in (plain, rows):
        x = x0.clone().requires_grad_()
        with mock.patch("qknorm_fairseq.fused_kernels._weight_grad_library", return_value=None):  # as without AMX
            ys = linears(x, *layers) if layers is rows else [layer(x) for layer in layers]
            torch.autograd.backward(ys, dys)
        results.append((x.grad, [(y, layer.weight.grad, layer.bias.grad) for y, layer in zip(ys, layers)]))
    (dx_autograd, plain_results), (dx_fused, fused_results) = results
    for a, b in zip(plain_results, fused_results):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    exact = sum(dy.double() @ layer.weight.double() for dy, layer in zip(dys, plain))
    assert not torch.equal(dx_fused, dx_autograd)
    assert (dx_fused.double() - exact).abs().sum() <= (dx_autograd.double() - exact).abs().sum()
    torch.testing.assert_close(dx_fused.double(), exact, rtol=1e-2, atol=1e-2)
    with mock.patch.object(_BiasLinears, "apply", side_effect=AssertionError("not these")):
        assert [y.dtype for y in linears(x0.float(), *[RowsLinear.swap(torch.nn.Linear(64, 8)) for _ in range(2)])] == \
            [torch.float32] * 2
        for layer in rows:
            layer.eval()
        assert all(torch.equal(y, layer(x0)) for y, layer in zip(linears(x0, *rows), plain))
