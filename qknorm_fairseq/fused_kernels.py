"""`--fused-kernels`: QKNorm's normalisation and --fused-loss's two passes over the logits, each
compiled once by torch.compile (Inductor) into one loop over memory, in training only; and
`--fused-adam` (multi_tensor_adam's): the gradient's scaling and Adam's update, likewise one loop.

In eager mode each is a chain of ops, each a pass over its tensor, on every query and key of every
attention and on the largest tensor of an update. Compiled, the chain becomes a loop that reads its
inputs once: `bash scripts/benchmark.sh kernels` times both, docs/performance.md gives the update.
The arithmetic is the same formula in fp32, rounded once to the activations' dtype; the backward is
autograd's of that formula, compiled, not the hand-written one of norms.py, so the bits differ from
a run without the flag.

On a CPU, QKNorm's l2 normalisation (p = 2, every preset's) of fp32 or bf16 rows is instead one C loop
forward and one backward (csrc/l2_normalize.c, built by native.py): Inductor's loops of it read each
row twice where the C loop reads it once (docs/performance.md times both). The same formula in fp32,
other rounding; where no C compiler is found, the compiled loops run, with a warning.

On a CPU too, --fused-loss's two passes over the logits (fp32 or bf16) are C loops (csrc/loss.c): the same
formula in fp32 with the attention softmax's exponential (below), other rounding than Inductor's loops, without
a compiled graph's calling cost (its guards and wrappers, in Python, at every call).

On a CPU as well, the matmul attention's additive mask, softmax and dropout are one C loop forward and one
backward (csrc/softmax_dropout.c) where the dropout is --fast-dropout's (the same draws, so the same kept
units) or none: the softmax in fp32 with its own exponential, other rounding than torch's softmax.

On a CPU, LayerNorm (fp32 or bf16 rows, the weight and bias of their dtype) is one C loop forward
and one backward (csrc/layer_norm.c; RowsLayerNorm, torch's LayerNorm with its class swapped, the
same parameters): the formula in fp32, rounded once, where torch's bf16 backward sums the weight's and bias's
gradients less exactly. In a pre-norm layer, --fast-dropout's residual dropout and the LayerNorm after it
are one loop (x = residual + dropout(y), h = LayerNorm(x)): the bits of the two loops, one pass fewer each
way, and the backward adds x's two gradients itself where autograd would add them in another pass.
RowsLinear (the projections and feed-forward layers, torch's Linear with its class swapped) gives bf16
rows oneDNN's linear with the bias inside the product, where addmm copies the bias into the output first;
the attention's projections of one input (q, k and v; the source's k and v) are one autograd node whose
backward sums the input's gradient inside the products (addmm_), where autograd rounds each layer's
gradient and adds them in passes of their own: other rounding of that gradient, no other bits. On a CPU with
AMX, a bf16 linear layer's weight and bias gradients are one C kernel (csrc/weight_grad.c: both operands packed
for AMX's tiles a chunk of tokens at a time, the bias gradient summed on the way), where oneDNN's product copies
both into its layouts at every call and torch sums the bias in a pass of its own: an fp32 sum in another order,
rounded once as before.

Dropout stays out of the compiled loops: Inductor's CPU random numbers are slow to draw (torch's dropout
through torch.compile against --fast-dropout's: `benchmark.sh kernels`, docs/performance.md). Shapes are
marked dynamic (batches differ in length and size): each function compiles once, plus once per
layout it meets (a contiguous query and a permuted one), a few seconds each, the first time only
(Inductor caches them on disk). Validation and decoding stay eager.
"""
import ctypes
import functools
import logging
import os
import shutil

import torch

from . import fast_dropout, native
from .attention import power_floor

logger = logging.getLogger(__name__)

COMPILERS = ("g++", "c++", "clang++")


def has_compiler():
    """Whether a C++ compiler Inductor can use for a CPU is on PATH."""
    return any(map(shutil.which, COMPILERS))


def check_compiler(device, flag="--fused-kernels"):
    """Inductor compiles C++ for a CPU: the one-line error where no compiler is found."""
    if torch.device(device).type == "cpu" and not has_compiler():
        raise ValueError(f"{flag} compiles C++ loops with torch.compile, and no C++ compiler "
                         f"({', '.join(COMPILERS)}) is on PATH: install one (apt install g++) or train without "
                         f"{flag}")


def _compiled(fn, flag="--fused-kernels", constant_floats=False):
    """FN through torch.compile, shapes dynamic; the compiler checked at the first call (decoding a
    checkpoint trained with the flag never calls these, so needs no compiler). CONSTANT_FLOATS: its
    float arguments compiled in as constants (a recompile per value), not as symbolic floats, which
    Inductor fails to lower as an exponent (torch 2.13: KeyError 'unbacked_bindings')."""
    compiled, checked = torch.compile(fn, dynamic=True), set()
    floats = {"specialize_float": True} if constant_floats and hasattr(torch._dynamo.config, "specialize_float") else {}

    def run(x, *args):
        if x.device.type not in checked:
            check_compiler(x.device, flag)
            native.inductor_cache()
            checked.add(x.device.type)
        with torch._dynamo.config.patch(**floats):
            return compiled(x, *args)

    return run


def _acc(x):
    return x.double() if x.dtype == torch.float64 else x.float()  # fp64 stays fp64 (gradcheck)


def _lp_normalize(x, p: float, eps: float):
    # x / max(||x||_p, eps) in fp32, rounded once to x's dtype; for p = 2 too the floor is on the sum
    # of squares (attention.power_floor), as the eager path's is for other p
    xf = _acc(x)
    powered = xf.square() if p == 2 else xf.abs().pow(p)
    return (xf * powered.sum(dim=-1, keepdim=True).clamp(min=power_floor(eps, p)).pow(-1.0 / p)).to(x.dtype)


def _loss_statistics(logits, target, forbidden):
    # per row: logsumexp, the target's logit, the sum of the allowed logits (FusedLabelSmoothedNLL)
    x = _acc(logits)
    total = x if forbidden is None else x.masked_fill(forbidden, 0.0)
    return torch.logsumexp(x, dim=-1), x.gather(-1, target[:, None]).squeeze(-1), total.sum(dim=-1)


def _loss_gradient(logits, lse, c_softmax, target, c_nll, c_smooth, weights):
    # softmax * c_softmax - c_nll onehot(target) - c_smooth allowed, rounded once to the logits' dtype
    g = torch.exp(_acc(logits) - lse[:, None]) * c_softmax[:, None]
    onehot = torch.arange(logits.size(1), device=logits.device)[None, :] == target[:, None]
    g = g - torch.where(onehot, c_nll[:, None], 0.0)
    g = g - c_smooth[:, None] * (1.0 if weights is None else weights[None, :])
    return g.to(logits.dtype)


def _adam_update(p, grad, exp_avg, exp_avg_sq, factor, step_size, beta1: float, beta2: float, eps: float,
                 decay: float):
    # optimizer.py's formula on one fp32 tensor, in place: the gradient first times FACTOR (fairseq's
    # deferred clipping and unscaling), then the moments, the decoupled weight decay and the step
    g = grad.float() * factor
    exp_avg.mul_(beta1).add_(g, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    if decay != 0:
        p.add_(p, alpha=-decay)
    p.sub_(exp_avg / (exp_avg_sq.sqrt() + eps) * step_size)  # STEP_SIZE a tensor: no recompiling as the LR moves


_compiled_lp_normalize = _compiled(_lp_normalize, constant_floats=True)  # x ** p


def _library():
    return native.kernels("l2_normalize", {
        "qk_l2_forward": ([ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int], None),
        "qk_l2_backward": ([ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2 + [ctypes.c_int], None),
        "qk_l2_to_grid": ([ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 4
                          + [ctypes.c_float, ctypes.c_void_p, ctypes.c_int], None),
        "qk_l2_from_grid": ([ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_int64] * 4 + [ctypes.c_void_p] * 2
                            + [ctypes.c_int], None),
    }, "--fused-kernels", "QKNorm's l2 normalisation runs as Inductor's compiled loops instead")


def _dense(x):
    """Whether X's memory is its elements without gaps, the last dim contiguous: the rows the C loops
    walk in memory order (a permuted view too: the encoder's heads are one), whatever the view's order."""
    if x.dim() == 0 or x.stride(-1) != 1:
        return False
    order = sorted(range(x.dim()), key=lambda i: -x.stride(i))
    return x.permute(order).is_contiguous()


def _as(t, like):
    """T in LIKE's strides (a copy where they differ), so that the C loops meet the same rows in both."""
    return t if t.stride() == like.stride() else torch.empty_like(like).copy_(t)


def kernel(name, *args):
    """Runs csrc/l2_normalize.c's NAME (one place for step_profile to time them)."""
    getattr(_library(), name)(*args)


class _L2Rows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, floor):
        d = x.size(-1)
        y = torch.empty_like(x)  # x's strides (torch.preserve_format)
        r = torch.empty(x.numel() // d, dtype=torch.float32, device=x.device)
        kernel("qk_l2_forward", native.DTYPES[x.dtype], x.data_ptr(), y.data_ptr(), r.data_ptr(), r.numel(), d, floor,
               native.threads(x.numel()))
        ctx.save_for_backward(x, r)
        return y

    @staticmethod
    def backward(ctx, dy):
        x, r = ctx.saved_tensors
        dy = _as(dy, x)
        dx = torch.empty_like(x)
        kernel("qk_l2_backward", native.DTYPES[x.dtype], x.data_ptr(), dy.data_ptr(), r.data_ptr(), dx.data_ptr(), r.numel(),
               x.size(-1), native.threads(x.numel()))
        return dx, None


class _L2Grids(torch.autograd.Function):
    """X (rows, heads, head_dim) l2-normalised straight into each of ROWS' groups' grids, times G where given."""

    @staticmethod
    def forward(ctx, x, g, rows, floor):
        heads, d = x.shape[1:]
        # g rounded to x's dtype, as the unfused product rounds it; passed by address: no read on the host
        gain = None if g is None else g.detach().to(x.dtype).float()
        r = torch.empty(x.shape[0] * heads, dtype=torch.float32)
        grids = []
        for group in rows.groups:
            grid = x.new_empty(group.count, heads, group.length, d)
            kernel("qk_l2_to_grid", native.DTYPES[x.dtype], x[group.start].data_ptr(), grid.data_ptr(),
                   r[group.start * heads].data_ptr(), group.lengths.ctypes.data, group.count, heads, d, group.length,
                   floor, native.pointer(gain), native.threads(grid.numel()))
            grids.append(grid)
        ctx.save_for_backward(x, r, gain)
        ctx.rows, ctx.g_like = rows, None if g is None else (g.dtype, g.shape)
        return tuple(grids)

    @staticmethod
    def backward(ctx, *grads):
        x, r, gain = ctx.saved_tensors
        rows = ctx.rows
        heads, d = x.shape[1:]
        dx = torch.empty_like(x)
        dx[rows.groups[-1].end:].zero_()  # the padding rows, which no grid reads
        # g's gradient from each (sentence, head) of every group
        dg = None if gain is None else torch.empty(sum(group.count for group in rows.groups) * heads)
        first = 0
        for group, grad in zip(rows.groups, grads):
            grad = grad.contiguous()
            kernel("qk_l2_from_grid", native.DTYPES[x.dtype], x[group.start].data_ptr(), grad.data_ptr(),
                   r[group.start * heads].data_ptr(), dx[group.start].data_ptr(), group.lengths.ctypes.data, group.count,
                   heads, d, group.length, native.pointer(gain),
                   None if dg is None else dg[first].data_ptr(), native.threads(grad.numel()))
            first += group.count * heads
        if dg is not None:
            dtype, shape = ctx.g_like
            dg = dg.sum().to(dtype).view(shape)
        return dx, dg, None, None


def l2_grids(x, rows, eps, g=None):
    """QKNorm's l2 normalisation of rows X (N, heads, head_dim) into each of ROWS' groups' grids
    (decoder_rows.Rows.grids), times QKNorm's G where given, by the C loops: the same values and x's
    gradient bit for bit as lp_normalize, Rows.grids and the product with g (g's gradient in fp32 partial sums);
    None where the C loops do not take X."""
    if not (x.device.type == "cpu" and x.dtype in native.DTYPES and x.is_contiguous() and x.numel()
            and native.is_enabled() and _library() is not None):
        return None
    return _L2Grids.apply(x, g, rows, power_floor(eps, 2))


def _softmax_library():
    return native.kernels("softmax_dropout", {
        "qk_softmax_dropout_forward": ([ctypes.c_int] + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3
                                       + [ctypes.c_int64] * 4 + [ctypes.c_uint64] * 4
                                       + [ctypes.c_int, ctypes.c_float, ctypes.c_int], None),
        "qk_softmax_dropout_backward": ([ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 2
                                        + [ctypes.c_float, ctypes.c_int], None),
    }, "--fused-kernels", "the attention's mask, softmax and dropout run as torch's ops instead")


def _layer_norm_library():
    return native.kernels("layer_norm", {
        "qk_layer_norm_forward": ([ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 2 + [ctypes.c_float, ctypes.c_int],
                                  None),
        "qk_dropout_add_norm_forward": ([ctypes.c_int] + [ctypes.c_void_p] * 9 + [ctypes.c_int64] * 2 + [ctypes.c_float]
                                        + [ctypes.c_uint64] * 4 + [ctypes.c_int, ctypes.c_float, ctypes.c_int], None),
        "qk_layer_norm_backward": ([ctypes.c_int] + [ctypes.c_void_p] * 7 + [ctypes.c_float] + [ctypes.c_void_p] * 4
                                   + [ctypes.c_int64] * 2 + [ctypes.c_int], None),
    }, "--fused-kernels", "LayerNorm runs as torch's layer_norm instead")


def layer_norm_kernel(name, *args):
    """Runs csrc/layer_norm.c's NAME (one place for step_profile to time them)."""
    getattr(_layer_norm_library(), name)(*args)


def _norm_backward(ctx, dh, gx=None):
    """(dx, dy, dw, db) of layer_norm.c's backward: dy (and gx's sum into dx) with the dropout only."""
    x, weight, mean, r, kept = ctx.saved_tensors
    dh = dh.contiguous()
    dx, dw, db = torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)
    dy = None if kept is None else torch.empty_like(x)
    gx = None if kept is None else gx.contiguous()
    layer_norm_kernel("qk_layer_norm_backward", native.DTYPES[x.dtype], dh.data_ptr(), x.data_ptr(), mean.data_ptr(),
                      r.data_ptr(), weight.data_ptr(), native.pointer(gx), native.pointer(kept), ctx.scale, dx.data_ptr(),
                      native.pointer(dy), dw.data_ptr(), db.data_ptr(), r.numel(), x.size(-1),
                      native.threads(x.numel()))
    return dx, dy, dw, db


def _statistics(x):
    rows = x.numel() // x.size(-1)
    return torch.empty(rows, dtype=torch.float32), torch.empty(rows, dtype=torch.float32)


class _LayerNormRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, eps):
        h = torch.empty_like(x)
        mean, r = _statistics(x)
        layer_norm_kernel("qk_layer_norm_forward", native.DTYPES[x.dtype], x.data_ptr(), weight.data_ptr(), bias.data_ptr(),
                          h.data_ptr(), mean.data_ptr(), r.data_ptr(), r.numel(), x.size(-1), eps, native.threads(x.numel()))
        ctx.save_for_backward(x, weight, mean, r, None)
        ctx.scale = 0.0
        return h

    @staticmethod
    def backward(ctx, dh):
        dx, _, dw, db = _norm_backward(ctx, dh)
        return dx, dw, db, None


class _DropoutAddNorm(torch.autograd.Function):
    """(x, h): x = residual + dropout(y) as --fast-dropout's (the same kept units and bits), h = LayerNorm(x)."""

    @staticmethod
    def forward(ctx, y, residual, p, weight, bias, eps):
        keep = 1.0 - p
        x, h = torch.empty_like(y), torch.empty_like(y)
        kept = torch.empty(y.shape, dtype=torch.uint8)
        mean, r = _statistics(y)
        ctx.scale = fast_dropout.scale(keep, y.dtype)
        layer_norm_kernel("qk_dropout_add_norm_forward", native.DTYPES[y.dtype], y.data_ptr(), residual.data_ptr(),
                          x.data_ptr(), kept.data_ptr(), weight.data_ptr(), bias.data_ptr(), h.data_ptr(), mean.data_ptr(),
                          r.data_ptr(), r.numel(), y.size(-1), eps, *fast_dropout.generator_state(),
                          fast_dropout.threshold(keep), ctx.scale, native.threads(y.numel()))
        ctx.save_for_backward(x, weight, mean, r, kept)
        return x, h

    @staticmethod
    def backward(ctx, gx, dh):
        dx, dy, dw, db = _norm_backward(ctx, dh, gx)
        return dy, dx, None, dw, db, None


def fits_layer_norm(x, weight, bias):
    """Whether layer_norm.c's loops take these (CPU, fp32 or bf16 rows, contiguous, over the last dim,
    the weight and bias of their dtype)."""
    return (x.device.type == "cpu" and x.dtype in native.DTYPES and x.numel() and x.is_contiguous()
            and weight is not None and bias is not None and weight.dtype == bias.dtype == x.dtype
            and weight.dim() == 1 and weight.numel() == x.size(-1) and weight.is_contiguous() and bias.is_contiguous()
            and native.is_enabled() and _layer_norm_library() is not None)


def layer_norm(x, weight, bias, eps):
    """LayerNorm over the last dim in fp32, rounded once to x's dtype, in one C loop forward and one
    backward where fits_layer_norm says; else torch's layer_norm."""
    if fits_layer_norm(x, weight, bias):
        return _LayerNormRows.apply(x, weight, bias, eps)
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, eps)


def _swap(cls, module):
    """MODULE, if exactly of CLS's torch base class, made a CLS by changing its class only (the same module,
    parameters and state dict); any other module as it is."""
    if type(module) is cls.__bases__[0]:
        module.__class__ = cls
    return module


class RowsLayerNorm(torch.nn.LayerNorm):
    """torch's LayerNorm (swap() makes one of it) that trains through layer_norm's C loops."""

    swap = classmethod(_swap)

    def forward(self, x):
        if self.training and len(self.normalized_shape) == 1:
            return layer_norm(x, self.weight, self.bias, self.eps)
        return super().forward(x)

    def after_dropout(self, dropout, y, residual):
        """(x, self(x)) for x = residual + DROPOUT(y), in one C loop forward and one backward where
        DROPOUT is --fast-dropout's drawing a mask, in training, and layer_norm.c takes the rows; else None."""
        if not (self.training and len(self.normalized_shape) == 1 and isinstance(dropout, fast_dropout.FastDropout)
                and dropout.draws_mask() and residual.shape == y.shape and residual.dtype == y.dtype
                and residual.is_contiguous() and fits_layer_norm(y, self.weight, self.bias)):
            return None
        return _DropoutAddNorm.apply(y, residual, dropout.p, self.weight, self.bias, self.eps)


@functools.cache
def _linear_pointwise():
    """oneDNN's linear with the bias added inside the product (torch's mkldnn op), or None where this torch
    has none or oneDNN no bf16 kernel for it (no bf16 instructions, or ONEDNN_MAX_CPU_ISA below them, as
    the demo's `cpu.isa: avx2`), where addmm still runs."""
    try:
        op = torch.ops.mkldnn._linear_pointwise.default
        one = torch.ones(1, 1, dtype=torch.bfloat16)
        op(one, one, one[0], "none", [], "")
        return op
    except (AttributeError, RuntimeError):
        logger.warning("--fused-kernels: oneDNN has no bf16 linear with the bias inside the product here; bf16 linear "
                       "layers run as torch's addmm (the same bits, one more pass; docs/performance.md)")
        return None


class _BiasLinears(torch.autograd.Function):
    """F.linear of bf16 rows X for one or more layers (WEIGHT, BIAS pairs), the bias added by oneDNN's product,
    where addmm first copies the bias into every row of the output (a pass over it): for one layer F.linear's
    bits (the product's fp32 sum plus the bias, rounded once; the backward AddmmBackward's products and sum).
    For several, X's gradient is summed inside the products (each addmm_ adds its product's fp32 sum to the sum
    so far, rounded once), where autograd rounds each layer's gradient and adds them in passes of their own."""

    @staticmethod
    def forward(ctx, x, *params):
        weights, biases = params[0::2], params[1::2]
        ctx.save_for_backward(x, *weights)
        return tuple(_linear_pointwise()(x, w, b, "none", [], "") for w, b in zip(weights, biases))

    @staticmethod
    def backward(ctx, *dys):
        x, *weights = ctx.saved_tensors
        dx = None
        if ctx.needs_input_grad[0]:
            for dy, w in zip(dys, weights):
                dx = dy.mm(w) if dx is None else dx.addmm_(dy, w)
        grads = []
        for i, dy in enumerate(dys):
            grads += weight_grads(dy, x, ctx.needs_input_grad[1 + 2 * i], ctx.needs_input_grad[2 + 2 * i])
        return (dx, *grads)


def _weight_grad_library():
    lib = native.kernels("weight_grad", {
        "qk_weight_grad_ready": ([], ctypes.c_int),
        "qk_weight_grad_work": ([ctypes.c_int64] * 2 + [ctypes.c_int], ctypes.c_int64),
        "qk_weight_grad": ([ctypes.c_void_p] * 2 + [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int], None),
    }, "--fused-kernels", "a linear layer's weight and bias gradients run as torch's product and sum instead")
    return lib if lib is not None and _amx_ready(lib) else None


@functools.cache
def _amx_ready(lib):
    # 0 where the library was built without AMX (a CPU without it, or the portable build): torch's ops run,
    # as on every CPU before AMX, so no warning. ONEDNN_MAX_CPU_ISA below AMX (standing in for an older CPU)
    # keeps AMX out of this kernel too
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "ALL").upper()
    return ("AMX" in isa or isa in ("ALL", "DEFAULT")) and bool(lib.qk_weight_grad_ready())


def weight_grads(dy, x, weight=True, bias=True):
    """(dy^T x, dy's column sums) of a linear layer's output gradient DY and input X (each None where not
    WEIGHT or BIAS): on a CPU with AMX, for bf16 rows whose widths are multiples of 16, both from
    csrc/weight_grad.c's one pass; else torch's product and sum."""
    lib = None
    if weight and dy.dtype == x.dtype == torch.bfloat16 and dy.dim() == x.dim() == 2 and dy.device.type == "cpu":
        lib = native.is_enabled() and _weight_grad_library()
    if not (lib and dy.size(1) % 16 == 0 and x.size(1) % 16 == 0 and dy.size(0) == x.size(0) > 0):
        return dy.t().mm(x) if weight else None, dy.sum(0) if bias else None
    dy, x = dy.contiguous(), x.contiguous()
    (n, out), inputs, threads = dy.shape, x.size(1), torch.get_num_threads()
    dw = dy.new_empty(out, inputs)
    db = dy.new_empty(out) if bias else None
    work = torch.empty(lib.qk_weight_grad_work(out, inputs, threads) + 64, dtype=torch.uint8)
    weight_grad_kernel(lib, dy.data_ptr(), x.data_ptr(), n, out, inputs, dw.data_ptr(), db.data_ptr() if bias else None,
                       -(-work.data_ptr() // 64) * 64, threads)
    return dw, db


def weight_grad_kernel(lib, *args):
    """Runs csrc/weight_grad.c's qk_weight_grad (one place for step_profile to time it)."""
    lib.qk_weight_grad(*args)


def _in_products(x, weight, bias):
    """Whether oneDNN's bf16 product with the bias inside takes these: bf16 rows (N, in) on a CPU, gradients recorded."""
    return (bias is not None and x.dim() == 2 and x.device.type == "cpu" and x.dtype == weight.dtype == bias.dtype
            == torch.bfloat16 and torch.is_grad_enabled() and native.is_enabled() and _linear_pointwise() is not None)


def linear(x, weight, bias=None):
    """F.linear; on a CPU, bf16 rows (N, in) with a bias, gradients recorded: through _BiasLinears."""
    if _in_products(x, weight, bias):
        return _BiasLinears.apply(x, weight, bias)[0]
    return torch.nn.functional.linear(x, weight, bias)


def linears(x, *layers):
    """[layer(x) for layer in LAYERS]; RowsLinear layers in training that all take X into oneDNN's products:
    through _BiasLinears, X's gradient summed inside the products (attention's projections of one input)."""
    if all(type(layer) is RowsLinear and layer.training and _in_products(x, layer.weight, layer.bias) for layer in layers):
        return _BiasLinears.apply(x, *(p for layer in layers for p in (layer.weight, layer.bias)))
    return [layer(x) for layer in layers]


class RowsLinear(torch.nn.Linear):
    """torch's Linear (swap() makes one of it) whose training forward goes through linear()."""

    swap = classmethod(_swap)

    def forward(self, x):
        return linear(x, self.weight, self.bias) if self.training else super().forward(x)


def softmax_kernel(name, *args):
    """Runs csrc/softmax_dropout.c's NAME (one place for step_profile to time them)."""
    getattr(_softmax_library(), name)(*args)


class _SoftmaxDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scores, mask, p):
        keep = 1.0 - p
        y = torch.empty_like(scores)
        out, kept = (torch.empty_like(scores), torch.empty(scores.shape, dtype=torch.uint8)) if p else (None, None)
        strides = (0, 0, 0) if mask is None else mask.expand(scores.shape).stride()[:3]
        state = fast_dropout.generator_state() if p else (0, 0, 0, 0)
        ctx.scale = fast_dropout.scale(keep, scores.dtype)
        softmax_kernel("qk_softmax_dropout_forward",
            native.DTYPES[scores.dtype], scores.data_ptr(), native.pointer(mask), *strides,
            y.data_ptr(), *(None, None) if out is None else (out.data_ptr(), kept.data_ptr()), *scores.shape, *state,
            fast_dropout.threshold(keep), ctx.scale, native.threads(scores.numel()))
        ctx.save_for_backward(y, kept)
        return y if out is None else out

    @staticmethod
    def backward(ctx, grad):
        y, kept = ctx.saved_tensors
        grad = grad.contiguous()
        dx = torch.empty_like(y)
        softmax_kernel("qk_softmax_dropout_backward",
            native.DTYPES[y.dtype], grad.data_ptr(), y.data_ptr(), native.pointer(kept), dx.data_ptr(),
            y.numel() // y.size(-1), y.size(-1), ctx.scale, native.threads(y.numel()))
        return dx, None, None


_MAX_KEYS = 16384  # a row's fp32 exponentials live on the thread's stack


def fits_softmax_dropout(scores, mask):
    """Whether softmax_dropout's C loops take these (CPU, fp32 or bf16 scores (batch, heads, queries,
    keys), contiguous; the mask of their dtype, broadcasting to them, a row of every key contiguous)."""
    return (scores.device.type == "cpu" and scores.dtype in native.DTYPES and scores.dim() == 4 and scores.is_contiguous()
            and 0 < scores.size(-1) <= _MAX_KEYS
            and (mask is None or (mask.dtype == scores.dtype and mask.dim() <= 4 and mask.size(-1) == scores.size(-1)
                                  and mask.stride(-1) == 1))
            and native.is_enabled() and _softmax_library() is not None)


def softmax_dropout(scores, mask, p):
    """--fast-dropout's dropout (the same stream, so the same kept units) of softmax(scores + mask)
    over the last dim, MASK additive (0 or -inf) and broadcasting to SCORES, in one C loop forward
    and one backward: the formulas in fp32, the probabilities rounded to the scores' dtype and their
    product with the mask rounded again, as the unfused ops round them; fits_softmax_dropout says where."""
    return _SoftmaxDropout.apply(scores, mask, p)


def lp_normalize(x, p, eps):
    """x / max(||x||_p, eps) along the last dim in fp32, rounded once to x's dtype: the C loops for
    p = 2 on a CPU (fp32 or bf16, dense), else Inductor's compiled loop."""
    if (p == 2 and x.device.type == "cpu" and x.dtype in native.DTYPES and x.numel() and _dense(x) and native.is_enabled()
            and _library() is not None):
        return _L2Rows.apply(x, power_floor(eps, 2))
    return _compiled_lp_normalize(x, p, eps)


_compiled_loss_statistics = _compiled(_loss_statistics)
_compiled_loss_gradient = _compiled(_loss_gradient)


def _loss_library():
    return native.kernels("loss", {
        "qk_loss_statistics": ([ctypes.c_int] + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 3
                               + [ctypes.c_int], ctypes.c_int64),
        "qk_loss_gradient": ([ctypes.c_int] + [ctypes.c_void_p] * 7 + [ctypes.c_int64] * 2 + [ctypes.c_void_p, ctypes.c_int],
                             None),
    }, "--fused-kernels", "the label-smoothed loss runs as Inductor's compiled loops instead")


def loss_kernel(name, *args):
    """Runs csrc/loss.c's NAME (one place for step_profile to time them)."""
    return getattr(_loss_library(), name)(*args)


def _loss_in_c(logits):
    return (logits.device.type == "cpu" and logits.dtype in native.DTYPES and logits.dim() == 2 and logits.is_contiguous()
            and native.is_enabled() and _loss_library() is not None)


def loss_statistics(logits, target, forbidden):
    """Per row of LOGITS (N, V): logsumexp, the target's logit and the sum of the allowed logits (FORBIDDEN:
    bool (V,), or None), in fp32 (fp64 logits: fp64): on a CPU csrc/loss.c's loop, else Inductor's."""
    if not _loss_in_c(logits):
        return _compiled_loss_statistics(logits, target, forbidden)
    rows, types = logits.shape
    target = target.to(torch.int64).contiguous()
    forbidden = None if forbidden is None else forbidden.to(torch.uint8).contiguous()
    lse, tgt, total = (logits.new_empty(rows, dtype=torch.float32) for _ in range(3))
    outside = loss_kernel("qk_loss_statistics", native.DTYPES[logits.dtype], logits.data_ptr(), target.data_ptr(),
                          native.pointer(forbidden), rows, types, lse.data_ptr(), tgt.data_ptr(), total.data_ptr(),
                          native.threads(logits.numel()))
    if outside:
        raise ValueError(f"--fused-loss: {outside} targets lie outside the logits' {types} types: the targets and the "
                         f"output layer come from different dictionaries")
    return lse, tgt, total


def loss_gradient(logits, lse, c_softmax, target, c_nll, c_smooth, weights):
    """softmax(LOGITS) * c_softmax - c_nll onehot(TARGET) - c_smooth WEIGHTS (None: 1 for every type), per row,
    rounded once to the logits' dtype: on a CPU csrc/loss.c's loop, else Inductor's."""
    if not _loss_in_c(logits):
        return _compiled_loss_gradient(logits, lse, c_softmax, target, c_nll, c_smooth, weights)
    rows, types = logits.shape
    f32 = [t.to(torch.float32).contiguous() for t in (lse, c_softmax, c_nll, c_smooth)]
    weights = None if weights is None else weights.to(torch.float32).contiguous()
    grad = torch.empty_like(logits)
    loss_kernel("qk_loss_gradient", native.DTYPES[logits.dtype], logits.data_ptr(), f32[0].data_ptr(), f32[1].data_ptr(),
                target.to(torch.int64).contiguous().data_ptr(), f32[2].data_ptr(), f32[3].data_ptr(), native.pointer(weights), rows,
                types, grad.data_ptr(), native.threads(logits.numel()))
    return grad


adam_update = _compiled(_adam_update, "--fused-adam")
