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
    it gives F.linear's bits, forward and backward, on bf16 rows; other inputs run F.linear itself."""
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
        y = module(x)
        y.backward(dy)
        results.append((y, x.grad, module.weight.grad, module.bias.grad))
    for a, b in zip(*results):
        assert torch.equal(a, b)
    called = []
    with mock.patch("qknorm_fairseq.fused_kernels._BiasLinear.apply", side_effect=lambda *a: called.append(1) or a[0]):
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
