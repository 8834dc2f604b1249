"""The AVX-512 forms of the C loops (csrc/simd.h: the attention softmax, LayerNorm's backward, the
dropouts, QKNorm's l2 normalisation) give the bits of their portable C (the same source built with -DQK_PORTABLE), on fp32 and
bf16, odd widths and row counts, masked keys, whole rows masked, NaN and infinite inputs, one or two threads."""
import pytest
import torch

from qknorm_fairseq import fast_dropout, fused_kernels, native


def _avx512():
    return {"avx512f", "avx512bw", "avx512vl"} <= set(native.cpu_flags())


pytestmark = [pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels"),
              pytest.mark.skipif(not _avx512(), reason="no AVX-512 on this CPU: both builds are the portable loops")]


def both(function, library):
    """FUNCTION of LIBRARY (a module's loader of a C library) as built for this machine and as its portable build"""
    fast = getattr(library(), function)
    with native.portable_loops():
        return fast, getattr(library(), function)


def bits(t):
    """T's bits, every NaN as one (which of two NaN operands an fp32 operation passes on, and so the sign and
    payload of its NaN, follows the order the compiler put them in; bf16 rounds every NaN to 0x7fc0)"""
    if t.is_floating_point():
        t = t.masked_fill(t.isnan(), float("nan"))
    return t.view({torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.uint8: torch.uint8}[t.dtype])


def softmax_forward(f, scores, mask, p, threads):
    y = torch.empty_like(scores)
    out = torch.empty_like(scores) if p else None
    kept = torch.zeros(scores.shape, dtype=torch.uint8) if p else None
    strides = (0, 0, 0) if mask is None else mask.expand(scores.shape).stride()[:3]
    keep = 1.0 - p
    f(native.DTYPES[scores.dtype], scores.data_ptr(), None if mask is None else mask.data_ptr(), *strides,
      y.data_ptr(), None if out is None else out.data_ptr(), None if kept is None else kept.data_ptr(),
      *scores.shape, 12345, 678, 91011, 1213, fast_dropout.threshold(keep), fast_dropout.scale(keep, scores.dtype),
      threads)
    return [t for t in (y, out, kept) if t is not None]


def masks(kind, shape, dtype):
    b, _, t, s = shape
    if kind == "pad":
        mask = torch.zeros(b, 1, 1, s, dtype=dtype)
        mask[..., s // 2 + 1:] = float("-inf")
        return mask
    if kind == "causal":
        return torch.triu(torch.full((t, s), float("-inf")), 1).to(dtype)
    if kind == "first sentence masked":
        mask = torch.zeros(b, 1, 1, s, dtype=dtype)
        mask[0] = float("-inf")
        return mask
    return None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 5, 7), (3, 2, 4, 16), (2, 4, 17, 17), (5, 4, 55, 55),
                                   (1, 2, 9, 100), (1, 1, 3, 1100)])
def test_softmax_dropout_forward_is_the_portable_loops_bit_for_bit(dtype, shape):
    fast, portable = both("qk_softmax_dropout_forward", fused_kernels._softmax_library)
    g = torch.Generator().manual_seed(sum(shape))
    for kind in ("none", "pad", "causal", "first sentence masked"):
        scores = (torch.randn(shape, generator=g) * 3).to(dtype)
        if kind == "first sentence masked":
            flat = scores.view(-1)
            flat[::7], flat[3::11], flat[5::13] = float("nan"), float("-inf"), -1000.0
        mask = masks(kind, shape, dtype)
        for p in (0.0, 0.1, 0.6, 1e-6):  # 1e-6: a threshold of 32768, every unit kept
            for threads in (1, 2):
                for a, b in zip(softmax_forward(fast, scores, mask, p, threads),
                                softmax_forward(portable, scores, mask, p, threads)):
                    assert torch.equal(bits(a), bits(b)), (kind, p, threads)


def layer_norm_backward(f, dtype, rows, d, dropout, threads, seed):
    g = torch.Generator().manual_seed(seed)
    x, dh, gx = (torch.randn(rows, d, generator=g).to(dtype) for _ in range(3))
    if rows > 5:
        x[3, 2], dh[4, 1] = float("nan"), float("inf")
    w = torch.randn(d, generator=g).to(dtype)
    mean, r = torch.randn(rows, generator=g), torch.rand(rows, generator=g) + 0.5
    kept = (torch.rand(rows, d, generator=g) < 0.8).to(torch.uint8)
    dx, dy = torch.zeros_like(x), torch.zeros_like(x)
    dw, db = torch.empty_like(w), torch.empty_like(w)
    f(native.DTYPES[dtype], dh.data_ptr(), x.data_ptr(), mean.data_ptr(), r.data_ptr(), w.data_ptr(),
      gx.data_ptr() if dropout else None, kept.data_ptr() if dropout else None, 1.25, dx.data_ptr(),
      dy.data_ptr() if dropout else None, dw.data_ptr(), db.data_ptr(), rows, d, threads)
    return dx, dy, dw, db


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, d", [(1, 16), (17, 48), (100, 256), (333, 512), (37, 20)])
def test_layer_norm_backward_is_the_portable_loops_bit_for_bit(dtype, rows, d):
    fast, portable = both("qk_layer_norm_backward", fused_kernels._layer_norm_library)
    for dropout in (False, True):
        for threads in (1, 2):
            seed = rows * 1000 + d
            for a, b in zip(layer_norm_backward(fast, dtype, rows, d, dropout, threads, seed),
                            layer_norm_backward(portable, dtype, rows, d, dropout, threads, seed)):
                assert torch.equal(bits(a), bits(b)), (dropout, threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("function", ["qk_relu_dropout_backward", "qk_dropout_backward"])
def test_dropout_backwards_are_the_portable_loops_bit_for_bit(dtype, function):
    fast, portable = both(function, fast_dropout.library)
    g = torch.Generator().manual_seed(len(function))
    for n in (1, 15, 17, 1000, 40000):
        grad = torch.randn(n, generator=g).to(dtype)
        grad[3::11], grad[4::13] = float("inf"), float("nan")
        if function == "qk_relu_dropout_backward":  # the saved output: NaN, 0 and -0 among them
            saved = torch.randn(n, generator=g).to(dtype)
            saved[::5], saved[1::7], saved[2::9] = float("nan"), 0.0, -0.0
        else:  # the kept units
            saved = (torch.rand(n, generator=g) < 0.7).to(torch.uint8)
        outs = []
        for f in (fast, portable):
            out = torch.full_like(grad, 3.0)
            f(native.DTYPES[dtype], grad.data_ptr(), saved.data_ptr(), out.data_ptr(), n, 1.25, 2)
            outs.append(out)
        assert torch.equal(bits(outs[0]), bits(outs[1])), n


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", [0, 1, 2])  # fast_dropout.c's MUL, ADD, RELU
def test_dropout_forwards_are_the_portable_loops_bit_for_bit(dtype, kind):
    fast, portable = both("qk_dropout_forward", fast_dropout.library)
    g = torch.Generator().manual_seed(kind)
    for n in (1, 15, 17, 1025, 5000):
        x, residual = torch.randn(n, generator=g).to(dtype), torch.randn(n, generator=g).to(dtype)
        x[::5], x[1::7], x[2::9], x[3::11], residual[4::13] = float("nan"), 0.0, -0.0, float("inf"), float("-inf")
        for keep in (0.9, 0.6, 1 - 1e-6):
            outs = []
            for f in (fast, portable):
                y, kept = torch.full_like(x, 3.0), torch.full((n,), 7, dtype=torch.uint8)
                f(kind, native.DTYPES[dtype], x.data_ptr(), residual.data_ptr(), y.data_ptr(), kept.data_ptr(), n,
                  11, 22, 33, 45, fast_dropout.threshold(keep), fast_dropout.scale(keep, dtype), 2)
                outs.append((y, kept))
            assert torch.equal(bits(outs[0][0]), bits(outs[1][0])), (n, keep)
            assert kind == 2 or torch.equal(outs[0][1], outs[1][1]), (n, keep)  # ReLU's keeps no units


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("s", [1, 7, 16, 17, 55, 100, 1100])
def test_softmax_dropout_backward_is_the_portable_loops_bit_for_bit(dtype, s):
    fast, portable = both("qk_softmax_dropout_backward", fused_kernels._softmax_library)
    g = torch.Generator().manual_seed(s)
    for rows in (1, 5, 16, 37):
        grad, y = torch.randn(rows, s, generator=g).to(dtype), torch.rand(rows, s, generator=g).to(dtype)
        grad.view(-1)[3::11], grad.view(-1)[4::13] = float("inf"), float("nan")
        kept = (torch.rand(rows, s, generator=g) < 0.7).to(torch.uint8)
        for dropout in (False, True):
            for threads in (1, 2):
                outs = []
                for f in (fast, portable):
                    dx = torch.full_like(grad, 3.0)
                    f(native.DTYPES[dtype], grad.data_ptr(), y.data_ptr(), kept.data_ptr() if dropout else None,
                      dx.data_ptr(), rows, s, 1.25, threads)
                    outs.append(dx)
                assert torch.equal(bits(outs[0]), bits(outs[1])), (rows, dropout, threads)


def l2_rows(dtype, rows, d, seed):
    """(x, dy) with rows whose sums of squares are NaN, infinite, and under the floor 1e-4"""
    g = torch.Generator().manual_seed(seed)
    x, dy = torch.randn(rows, d, generator=g).to(dtype), torch.randn(rows, d, generator=g).to(dtype)
    if rows > 4:
        x[1, 3], x[2, 0], x[3] = float("nan"), float("inf"), 1e-3
        dy[4, 5] = float("-inf")
    return x, dy


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, d", [(1, 16), (17, 64), (100, 32), (37, 20)])
def test_l2_rows_are_the_portable_loops_bit_for_bit(dtype, rows, d):
    lib = fused_kernels._library
    (fwd, fwd_portable), (bwd, bwd_portable) = both("qk_l2_forward", lib), both("qk_l2_backward", lib)
    x, dy = l2_rows(dtype, rows, d, rows * d)
    for threads in (1, 2):
        outs = []
        for forward, backward in ((fwd, bwd), (fwd_portable, bwd_portable)):
            y, r, dx = torch.full_like(x, 3.0), torch.empty(rows), torch.full_like(x, 3.0)
            forward(native.DTYPES[dtype], x.data_ptr(), y.data_ptr(), r.data_ptr(), rows, d, 1e-4, threads)
            backward(native.DTYPES[dtype], x.data_ptr(), dy.data_ptr(), r.data_ptr(), dx.data_ptr(), rows, d, threads)
            outs.append((y, r, dx))
        for a, b in zip(*outs):
            assert torch.equal(bits(a), bits(b)), threads


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("lengths, heads, d", [([1], 1, 16), ([5, 17, 3], 4, 64), ([40, 33], 2, 32), ([6, 2], 3, 20)])
def test_l2_grids_are_the_portable_loops_bit_for_bit(dtype, lengths, heads, d):
    lib = fused_kernels._library
    (to, to_portable), (back, back_portable) = both("qk_l2_to_grid", lib), both("qk_l2_from_grid", lib)
    count, length, tokens = len(lengths), max(lengths) + 2, sum(lengths)
    x, _ = l2_rows(dtype, tokens * heads, d, tokens + d)
    dgrid, _ = l2_rows(dtype, count * heads * length, d, heads)
    lens = torch.tensor(lengths, dtype=torch.int64)
    for gain in (None, torch.tensor([1.5])):
        for threads in (1, 2):
            outs = []
            for forward, backward in ((to, back), (to_portable, back_portable)):
                grid, r = torch.full((count, heads, length, d), 3.0).to(dtype), torch.empty(tokens * heads)
                dx, dg = torch.full_like(x, 3.0), torch.full((count * heads,), 3.0)
                g = None if gain is None else gain.data_ptr()
                forward(native.DTYPES[dtype], x.data_ptr(), grid.data_ptr(), r.data_ptr(), lens.data_ptr(), count,
                        heads, d, length, 1e-4, g, threads)
                backward(native.DTYPES[dtype], x.data_ptr(), dgrid.data_ptr(), r.data_ptr(), dx.data_ptr(),
                         lens.data_ptr(), count, heads, d, length, g, None if gain is None else dg.data_ptr(), threads)
                outs.append((grid, r, dx, dg))
            for a, b in zip(*outs):
                assert torch.equal(bits(a), bits(b)), (gain, threads)


def test_portable_loops_switch_each_library_only_within_them():
    fast = fused_kernels._softmax_library()
    with native.portable_loops():
        portable = fused_kernels._softmax_library()
    assert portable is not fast and fused_kernels._softmax_library() is fast
    assert native.load("softmax_dropout", portable=True)._name != native.load("softmax_dropout")._name
