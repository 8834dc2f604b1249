"""--fused-kernels in beam search on a CPU: the attention of a decoding step (one query per row and head in
self-attention, a sentence's beams in cross-attention) as one C loop, csrc/step_attention.c, reading the
decoder cache's keys and values where they lie (NormAttention._step_loop, from either decoder step), and the
softmax itself where fairseq's step asks a layer for its weights. Its rounding is its own: fp32 sums in another
order than scaled_dot_product_attention's or matmul's.
Training, the encoder and the validation loss keep their kernels."""
import ctypes

import torch

from . import native

MAX_QUERIES = 16  # per (sentence, head): a step's beams; more (a larger beam) keep torch's products
_STRIDES = [ctypes.c_void_p] + [ctypes.c_int64] * 3


def _library():
    return native.kernels("step_attention", {
        "qk_step_attention": ([ctypes.c_int] + _STRIDES * 4 + [ctypes.c_void_p] * 2 + [ctypes.c_int64] * 5
                              + [ctypes.c_float, ctypes.c_int], None),
    }, "--fused-kernels", "a decoding step's attention runs as torch's kernels instead")


def fits(q, k, v, mask):
    """Whether the C loop takes these: CPU tensors (batch, heads, length, head_dim) of one dtype (fp32 or bf16),
    each last dim contiguous, at most MAX_QUERIES queries; an additive MASK of their dtype broadcasting to the
    scores (batch, heads, queries, keys), its keys contiguous."""
    if not (q.device.type == "cpu" and q.dtype in native.DTYPES and q.dtype == k.dtype == v.dtype
            and q.dim() == k.dim() == v.dim() == 4 and q.size(2) <= MAX_QUERIES and k.size(2) > 0
            and q.shape[:2] == k.shape[:2] == v.shape[:2] and k.shape[2:] == v.shape[2:] and q.size(3) == k.size(3)
            and q.stride(3) == k.stride(3) == v.stride(3) == 1):
        return False
    scores = (*q.shape[:3], k.size(2))
    if mask is not None and not (mask.dtype == q.dtype and mask.dim() <= 4 and mask.stride(-1) == 1
                                 and _broadcast(mask.shape, scores) == scores):
        return False
    return native.is_enabled() and _library() is not None


def _broadcast(*shapes):
    try:
        return torch.broadcast_shapes(*shapes)
    except RuntimeError:
        return None


def attention(q, k, v, mask=None, scale=1.0, with_weights=False):
    """softmax(scale q k^T + mask) v for q (batch, heads, queries, head_dim) over k, v (batch, heads, keys,
    head_dim), MASK additive (0 or -inf), as `fits` takes them: (batch, heads, queries, head_dim), contiguous;
    WITH_WEIGHTS: (that, the softmax (batch, heads, queries, keys) in fp32)."""
    batch, heads, queries, d = q.shape
    keys = k.size(2)
    out = torch.empty(batch, heads, queries, d, dtype=q.dtype)
    weights = torch.empty(batch, heads, queries, keys) if with_weights else None
    m = (0, 0, 0) if mask is None else mask.expand(batch, heads, queries, keys).stride()[:3]
    _library().qk_step_attention(
        native.DTYPES[q.dtype], q.data_ptr(), *q.stride()[:3], k.data_ptr(), *k.stride()[:3], v.data_ptr(),
        *v.stride()[:3], native.pointer(mask), *m, out.data_ptr(), native.pointer(weights), batch, heads, queries,
        keys, d, float(scale), native.threads(batch * heads * keys * d))
    return (out, weights) if with_weights else out
