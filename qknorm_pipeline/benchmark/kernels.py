"""Each norm and l_p normalisation against its reference implementation, timed interleaved in one
process on the CPU (process CPU time, one thread by default).

    python -m qknorm_pipeline.benchmark kernels [--dim 256 --heads 4 --p 2 4 3.5] [--out results/kernels]

Norms (ScaleNorm, RMSNorm) against fairseq's LayerNorm on (tokens, dim); lp_normalize against
torch.linalg.vector_norm on (tokens, heads, dim / heads), p = 2 also in bf16 (with gradients: the
hand-written backward against autograd's); --fast-dropout's dropout (p = 0.4) on (tokens, 4 dim), its
C loop against its path through torch's ops and that against torch's dropout, and its ReLU with
dropout, C loop against torch's ops; and --attention-kernel matmul against scaled_dot_product_attention on (tokens / 24,
heads, 24, dim / heads), each in fp32 and bf16; a decoding step's attention (tokens / 2 rows, one query each over 40
keys, all views into one tensor as the decoder cache's), matmul's and --fused-kernels' C loop against sdpa's, forward
only; --fused-kernels' attention softmax with its dropout
(bf16 scores (tokens / 24, heads, 24, 24)), C loop against torch's ops; the C loops with AVX-512 forms (the
softmax's, the dropouts', LayerNorm's on (tokens, dim), the l2 normalisation's) against their portable
builds; a linear layer (tokens, dim) -> 4 dim with its weight and bias gradients from the AMX kernel against
torch's product and sum; --fused-loss's label-smoothed loss against the criterion's path through fp32 log_softmax on bf16
logits (tokens, vocab); --fused-kernels' compiled normalisation (bf16, p = 2) and loss against their eager
paths and their C loops against them, and torch's dropout through torch.compile against --fast-dropout's, where a C++ compiler is found (the
compiling falls in the warm-up call, outside the times). Prints (and with --out writes OUT.md) the median
microseconds per call, forward and forward + backward, and the ratio to the reference.
"""
import contextlib
import statistics
import sys
import time

import torch

from ..files import write_atomic

HELP = "norm and l_p-normalisation kernels against their references (CPU)"


def run(opts):
    from fairseq.modules import LayerNorm

    from qknorm_fairseq import fused_kernels, native
    from qknorm_fairseq.attention import EPS, NormAttention, lp_normalize
    from qknorm_fairseq.criterion import FusedLabelSmoothedNLL, masked_label_smoothed_nll_loss
    from qknorm_fairseq.fast_dropout import FastDropout, fast_dropout
    from qknorm_fairseq.norms import RMSNorm, ScaleNorm

    d, hd = opts.dim, opts.dim // opts.heads

    def attention(kernel):  # NormAttention's softmax attention of x to x (queries, keys, values)
        module = NormAttention(d, opts.heads, self_attention=True, attention_kernel=kernel)
        return lambda x: module._fused(x, x, x, None, None)

    sdpa_attention, matmul_attention = attention("sdpa"), attention("matmul")
    keys = 40  # a decoding step's self-attention: one query a row over 40 cached keys, read through strides

    def step_attention(kernel, fused=False):  # x (rows, heads, 1 + 2 keys, hd): the query, keys and values as views
        module = NormAttention(d, opts.heads, self_attention=True, attention_kernel=kernel, fused_kernels=fused).eval()

        def run(x):
            return module._fused(x[:, :, :1], x[:, :, 1:keys + 1], x[:, :, keys + 1:], None, None, step=True)
        run.forward_only = True
        return run
    sentences = max(1, opts.tokens // 24)

    def reference_lp(p):  # the formula in autograd's ops, in fp32 (p = 2: the plain ops of norms.l2_normalize)
        return lambda x: (x / torch.linalg.vector_norm(x, ord=p, dim=-1, keepdim=True, dtype=torch.float32)
                          .clamp(min=1e-6)).to(x.dtype)

    # (name, function, reference name, input shape, dtype)
    f32, bf16 = torch.float32, torch.bfloat16
    cases = [("LayerNorm", LayerNorm(d), None, (opts.tokens, d), f32),
             ("ScaleNorm", ScaleNorm(d), "LayerNorm", (opts.tokens, d), f32),
             ("RMSNorm", RMSNorm(d), "LayerNorm", (opts.tokens, d), f32)]
    for p in opts.p:
        cases += [(f"vector_norm p={p:g}", reference_lp(p), None, (opts.tokens, opts.heads, hd), f32),
                  (f"lp_normalize p={p:g}", lambda x, p=p: lp_normalize(x, p), f"vector_norm p={p:g}",
                   (opts.tokens, opts.heads, hd), f32)]
    if 2 in opts.p:  # QKNorm's p in every preset, also on bf16 q and k
        cases += [("vector_norm p=2 bf16", reference_lp(2), None, (opts.tokens, opts.heads, hd), bf16),
                  ("lp_normalize p=2 bf16", lambda x: lp_normalize(x, 2), "vector_norm p=2 bf16",
                   (opts.tokens, opts.heads, hd), bf16)]

    def without_c(fn):  # without the C loops: --fast-dropout's masks applied by torch's ops, l2 and loss compiled
        def run(x):
            with native.enabled(False):
                return fn(x)
        return run

    def portable(fn):  # the C loops' portable builds (no AVX-512 forms), forward and backward (call's context)
        def run(x):
            return fn(x)
        run.context = native.portable_loops
        return run

    relu_dropout = FastDropout(0.4).relu
    for tag, dtype in (("fp32", f32), ("bf16", bf16)):
        cases += [(f"torch dropout {tag}", lambda x: torch.nn.functional.dropout(x, 0.4), None, (opts.tokens, 4 * d), dtype),
                  (f"fast_dropout, torch's ops {tag}", without_c(lambda x: fast_dropout(x, 0.4)), f"torch dropout {tag}",
                   (opts.tokens, 4 * d), dtype),
                  (f"fast_dropout {tag}", lambda x: fast_dropout(x, 0.4), f"fast_dropout, torch's ops {tag}",
                   (opts.tokens, 4 * d), dtype),
                  (f"relu dropout, torch's ops {tag}", without_c(relu_dropout), None, (opts.tokens, 4 * d), dtype),
                  (f"relu dropout {tag}", relu_dropout, f"relu dropout, torch's ops {tag}", (opts.tokens, 4 * d), dtype),
                  (f"sdpa attention {tag}", sdpa_attention, None, (sentences, opts.heads, 24, hd), dtype),
                  (f"matmul attention {tag}", matmul_attention, f"sdpa attention {tag}",
                   (sentences, opts.heads, 24, hd), dtype),
                  (f"sdpa step attention {tag}", step_attention("sdpa"), None, (opts.tokens // 2, opts.heads, 1 + 2 * keys, hd),
                   dtype),
                  (f"matmul step attention {tag}", step_attention("matmul"), f"sdpa step attention {tag}",
                   (opts.tokens // 2, opts.heads, 1 + 2 * keys, hd), dtype)]
        if native.compiler() is not None:
            cases.append((f"step attention loop {tag}", step_attention("sdpa", fused=True), f"sdpa step attention {tag}",
                          (opts.tokens // 2, opts.heads, 1 + 2 * keys, hd), dtype))
    if native.compiler() is not None:  # --fused-kernels' attention softmax and its dropout, one C loop each way
        ones = torch.ones(d, dtype=bf16)

        def softmax_dropout(x):
            return fused_kernels.softmax_dropout(x, None, 0.4)

        def layer_norm(x):
            return fused_kernels.layer_norm(x, ones, ones, 1e-5)

        cases += [("softmax dropout, torch's ops bf16", without_c(lambda x: fast_dropout(torch.softmax(x, -1), 0.4)),
                   None, (sentences, opts.heads, 24, 24), bf16),
                  ("softmax dropout bf16", softmax_dropout, "softmax dropout, torch's ops bf16",
                   (sentences, opts.heads, 24, 24), bf16),
                  ("layer norm loop bf16", layer_norm, None, (opts.tokens, d), bf16)]
        # the C loops with AVX-512 forms (csrc/simd.h) against their portable builds: the same bits
        for name, fn, shape in (("softmax dropout bf16", softmax_dropout, (sentences, opts.heads, 24, 24)),
                                ("fast_dropout bf16", lambda x: fast_dropout(x, 0.4), (opts.tokens, 4 * d)),
                                ("relu dropout bf16", relu_dropout, (opts.tokens, 4 * d)),
                                ("layer norm loop bf16", layer_norm, (opts.tokens, d))):
            cases.append((f"{name}, portable C", portable(fn), name, shape, bf16))
        # a feed-forward layer's weight and bias gradients: the AMX kernel against torch's product and sum (the
        # portable build has no AMX form; on a CPU without AMX both rows are torch's)
        w, b = (torch.randn(4 * d, d) / d ** 0.5).to(bf16).requires_grad_(), torch.zeros(4 * d, dtype=bf16, requires_grad=True)

        def linear(x):
            return fused_kernels.linear(x, w, b)

        cases += [("linear bf16", linear, None, (opts.tokens, d), bf16),
                  ("linear bf16, torch's weight gradient", portable(linear), "linear bf16", (opts.tokens, d), bf16)]
    target = torch.randint(4, opts.vocab, (opts.tokens,), generator=torch.Generator().manual_seed(0))
    every = torch.ones(opts.vocab, dtype=torch.bool)
    cases += [("log_softmax loss bf16", lambda x: masked_label_smoothed_nll_loss(
                   torch.log_softmax(x.float(), -1), target, 0.1, ignore_index=1, allowed=every)[0], None,
               (opts.tokens, opts.vocab), bf16),
              ("fused loss bf16", lambda x: FusedLabelSmoothedNLL.apply(x, target, 0.1, 1, None, False)[0],
               "log_softmax loss bf16", (opts.tokens, opts.vocab), bf16)]
    if fused_kernels.has_compiler():
        native.inductor_cache()

        def fused_kernels_loss(x):  # on a CPU csrc/loss.c's loops, without_c Inductor's
            return FusedLabelSmoothedNLL.apply(x, target, 0.1, 1, None, False, True)[0]

        compiled_dropout = torch.compile(lambda x: torch.nn.functional.dropout(x, 0.4), dynamic=True)
        cases += [("compiled torch dropout bf16", compiled_dropout, "fast_dropout bf16", (opts.tokens, 4 * d), bf16),
                  ("fused_kernels loss bf16, compiled", without_c(fused_kernels_loss), "fused loss bf16",
                   (opts.tokens, opts.vocab), bf16),
                  ("fused_kernels loss bf16", fused_kernels_loss, "fused_kernels loss bf16, compiled",
                   (opts.tokens, opts.vocab), bf16)]
        if 2 in opts.p:
            cases += [("fused_kernels lp_normalize p=2 bf16, compiled",
                       without_c(lambda x: fused_kernels.lp_normalize(x, 2.0, EPS)), "lp_normalize p=2 bf16",
                       (opts.tokens, opts.heads, hd), bf16),
                      ("fused_kernels lp_normalize p=2 bf16", lambda x: fused_kernels.lp_normalize(x, 2.0, EPS),
                       "fused_kernels lp_normalize p=2 bf16, compiled", (opts.tokens, opts.heads, hd), bf16)]
            if native.compiler() is not None:  # its l2 C loops' AVX-512 forms against their portable build
                cases.append(("fused_kernels lp_normalize p=2 bf16, portable C",
                              portable(lambda x: fused_kernels.lp_normalize(x, 2.0, EPS)),
                              "fused_kernels lp_normalize p=2 bf16", (opts.tokens, opts.heads, hd), bf16))
    else:
        print(f"no C++ compiler ({', '.join(fused_kernels.COMPILERS)}) on PATH: --fused-kernels' compiled kernels left out",
              file=sys.stderr)
    inputs = {(shape, dtype): torch.randn(shape).to(dtype) for *_, shape, dtype in cases}
    def grads(fn):  # forward, and forward + backward but for a decoding step's kernels
        return (False,) if getattr(fn, "forward_only", False) else (False, True)

    times = {(name, grad): [] for name, fn, *_ in cases for grad in grads(fn)}

    def call(fn, x, grad):
        x = x.detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad), getattr(fn, "context", contextlib.nullcontext)():
            for _ in range(opts.iters):
                y = fn(x)
                if grad:
                    y.sum().backward()

    for _ in range(opts.reps):
        for name, fn, _, shape, dtype in cases:
            for grad in grads(fn):
                call(fn, inputs[shape, dtype], grad)  # warm-up
                t0 = time.process_time()
                call(fn, inputs[shape, dtype], grad)
                times[name, grad].append((time.process_time() - t0) / opts.iters * 1e6)
    lines = [f"# Kernel micro-benchmark (CPU, {torch.get_num_threads()} threads, {opts.reps} interleaved "
             f"repetitions of {opts.iters} calls, process CPU time; torch {torch.__version__})", "",
             f"Inputs: norms on ({opts.tokens}, {d}); l_p normalisation on ({opts.tokens}, {opts.heads}, {hd}); "
             f"dropout on ({opts.tokens}, {4 * d}); attention on "
             f"({sentences}, {opts.heads}, 24, {hd}), its scores ({sentences}, {opts.heads}, 24, 24); a decoding step's "
             f"attention (no backward) on ({opts.tokens // 2}, {opts.heads}, 1, {hd}) queries over {keys} keys; "
             f"loss on ({opts.tokens}, {opts.vocab}).", "",
             "| kernel | forward us | ratio | forward+backward us | ratio | reference |", "|---|---|---|---|---|---|"]
    for name, _, ref, *_ in cases:
        row = [name]
        for grad in (False, True):
            if (name, grad) not in times:
                row += ["", ""]
                continue
            med = statistics.median(times[name, grad])
            row += [f"{med:.1f}", f"{med / statistics.median(times[ref, grad]):.2f}" if ref else "1"]
        lines.append("| " + " | ".join(row + [ref or ""]) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if opts.out:
        write_atomic(opts.out + ".md", text)
    return times


def add_arguments(k):
    k.add_argument("--dim", type=int, default=256)
    k.add_argument("--heads", type=int, default=4)
    k.add_argument("--tokens", type=int, default=384, help="rows per call (default: the speed batch, 16 x 24)")
    k.add_argument("--vocab", type=int, default=3172, help="types of the loss's logits (default: gl->en's)")
    k.add_argument("--p", type=float, nargs="+", default=[2.0, 4.0, 3.5], help="l_p norms to time")
    k.add_argument("--iters", type=int, default=200)
    k.add_argument("--reps", type=int, default=5)
    k.add_argument("--threads", type=int, default=1)
    k.add_argument("--out", help="also write OUT.md")
