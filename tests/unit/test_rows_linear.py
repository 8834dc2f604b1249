"""--fused-kernels' RowsLinear: the projections' and feed-forward layers' bias added inside oneDNN's product."""
import copy
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
