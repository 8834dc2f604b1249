"""What one training update costs the host, counted on a CPU: fairseq-train as train.sh runs it,
with one update watched.

    python -m qknorm_pipeline.benchmark.step_profile OUT.json [--plain] [--update K] -- FAIRSEQ-TRAIN ARGS

Trains K updates (default 6; give --log-interval above K so that update K does not log) and,
during update K, counts:
- ATen ops by phase (every op dispatched below autograd, views included): forward (the criterion:
  model and loss), backward, clip (the gradient norm and clipping, with the bf16 master copy),
  step (the optimizer step), other (the rest of the trainer's update: zero_grad, gradient scaling,
  meters, the sample's preparation); and by name within each phase (ops_by_name), which is what
  tells two rows' counts apart;
- host-device syncs: ops whose result the host must read (`.item()`, `bool(t)`, `int(t)`:
  aten::_local_scalar_dense; data-dependent shapes: nonzero, masked_select, unique; equal,
  is_nonzero) on a tensor that would live on the device (not one made from a shape), and tensors
  made from Python data (lift_fresh: a host-to-device copy on a GPU); each site is listed with its
  Python caller;
during update K - 1, with torch.profiler: its wall time (update_ms), the CPU time of its ATen ops and
the share of the eight costliest (self time; op_ms, top_ops), and its time by op family (op_families,
ms; FAMILIES below): the optimizer step and the gradient clipping whole, --fast-dropout's mask draws
whole (numpy's included) and its C loops whole (draws and masks applied, forward and backward),
--fused-kernels' compiled loops, its l2 and LayerNorm C loops as norms (with the residual dropout before a
LayerNorm where one loop applies both), its attention softmax's and --fused-loss's C loops as softmax and
loss, every other ATen op by its name, and "framework" for the rest of the wall time (Python, dispatch, the
autograd engine, the profiler's own cost);
then the training split's batches as the trainer draws them in an epoch: their number, the
distinct (sentences, source length, target length) shapes and the padding fraction (pad tokens /
all tokens: source and target together, and each side alone: padding_source, padding_target); with
--packed-decoder also the padding of its attention grids (padding_packed_grids: pads / positions of
each batch's --packed-groups grids) and their self-attention scores (sentences x length^2) over one
grid's per batch (packed_scores). --plain runs fairseq's own Trainer (plain
fairseq-train); otherwise qknorm_pipeline.fairseq_train's, which here also trains --cpu
--bf16 on a CPU without native bf16 (the counts do not depend on the instructions; the times do).
"""
import json
import sys
import time
import traceback
from collections import Counter

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..paths import shareable

SYNCS = ("_local_scalar_dense", "nonzero", "masked_select", "unique", "equal", "is_nonzero")
H2D = ("lift_fresh", "lift_fresh_copy")
# A tensor made without a device (torch.onnx.operators.shape_as_tensor, read by fairseq's position
# embeddings, makes one) lives on the host on every machine; so does whatever is computed from host
# tensors only. Reading those is no sync. Code meant for the device names it (device=x.device).
HOST = "_qknorm_on_host"

# An update's time by op family: ATen ops by name (self time), the first family that names one; a name
# with its namespace is an op outside ATen (oneDNN's linear, which --fused-kernels' RowsLinear calls on bf16 rows)
FAMILIES = {
    "matrix products": ("mm", "addmm", "bmm", "baddbmm", "addbmm", "mv", "addmv", "dot", "_addmm_activation",
                        "mkldnn::_linear_pointwise"),
    "fused attention": ("_scaled_dot_product_flash_attention_for_cpu",
                        "_scaled_dot_product_flash_attention_for_cpu_backward"),
    "norms": ("native_layer_norm", "native_layer_norm_backward", "linalg_vector_norm", "norm"),
    "softmax and loss": ("_softmax", "_softmax_backward_data", "_log_softmax", "_log_softmax_backward_data",
                         "logsumexp", "nll_loss_forward", "nll_loss_backward", "gather", "scatter_add_"),
    "dropout": ("bernoulli_", "native_dropout", "native_dropout_backward"),
}
ELEMENTWISE = "elementwise and copies"  # every other ATen op: casts, residuals, masks, activations
# --fused-kernels' loops, compiled by torch.compile: the self time of the profiler's event around each
# compiled graph (an op the graph calls, a matrix product say, is its own ATen event)
COMPILED, COMPILED_EVENT = "compiled loops", "## Call CompiledFxGraph"
# whole regions of an update, everything inside them (Python and non-ATen work too)
OPTIMIZER = "optimizer and clip"
# kernel: --fast-dropout's C loops; l2_kernel, layer_norm_kernel, softmax_kernel and loss_kernel: --fused-kernels' l2
# normalisation's, LayerNorm's (with the residual dropout before it), attention softmax's (its dropout too) and
# --fused-loss's;
# weight_grad_kernel: its linear layers' weight gradients in AMX tiles (their bias gradients summed on the way)
REGIONS = {"clip": OPTIMIZER, "step": OPTIMIZER, "keep_mask": "dropout", "kernel": "dropout", "l2_kernel": "norms",
           "layer_norm_kernel": "norms", "softmax_kernel": "softmax and loss", "loss_kernel": "softmax and loss",
           "weight_grad_kernel": "matrix products"}
FRAMEWORK = "framework"


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.phase, self.ops, self.by_name, self.syncs = "other", Counter(), Counter(), []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.ops[self.phase] += 1
        name = func.overloadpacket.__name__
        self.by_name[self.phase, name] += 1
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        on_host = bool(inputs) and all(getattr(t, HOST, False) for t in inputs)
        if (name in SYNCS and not on_host) or name in H2D:
            self.syncs.append({"op": name, "phase": self.phase, "kind": "sync" if name in SYNCS else "h2d",
                               "where": caller()})
        out = func(*args, **kwargs)
        if on_host or (not inputs and kwargs.get("device") is None):
            for t in pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    setattr(t, HOST, True)
        return out


def caller():
    """The innermost Python frame outside torch and this file."""
    for frame in reversed(traceback.extract_stack()[:-2]):
        if "/torch/" not in frame.filename and not frame.filename.endswith("step_profile.py"):
            return f"{shareable(frame.filename).split('site-packages/')[-1]}:{frame.lineno} {frame.name}"
    return "?"


def phased(counter, name, fn):
    def wrapped(*args, **kwargs):
        before, counter.phase = counter.phase, name
        try:
            return fn(*args, **kwargs)
        finally:
            counter.phase = before
    return wrapped


def epoch_shapes(trainer):
    """(batches, distinct shapes, {padding fraction: both sides, source, target; with --packed-decoder
    its grids' padding and scores}) of an epoch of the training split."""
    cfg, task = trainer.cfg, trainer.task
    ds = task.dataset(cfg.dataset.train_subset)
    indices, _ = ds.filter_indices_by_size(ds.ordered_indices(), trainer.get_model().max_positions())
    batches = ds.batch_by_size(indices, max_tokens=cfg.dataset.max_tokens, max_sentences=cfg.dataset.batch_size,
                               required_batch_size_multiple=cfg.dataset.required_batch_size_multiple)
    decoder = getattr(trainer.get_model(), "decoder", None)
    packed = getattr(decoder, "packed", False)
    if packed:
        from qknorm_fairseq.decoder_rows import group_sizes
    shapes, pad, total, grids = set(), Counter(), Counter(), Counter()
    for batch in batches:
        sample = ds.collater([ds[int(i)] for i in batch])
        src, tgt = sample["net_input"]["src_tokens"], sample["target"]
        shapes.add((src.size(0), src.size(1), tgt.size(1)))
        pad["source"] += int(src.eq(task.src_dict.pad()).sum())
        pad["target"] += int(tgt.eq(task.tgt_dict.pad()).sum())
        total["source"] += src.numel()
        total["target"] += tgt.numel()
        if packed:
            lengths = sorted(tgt.ne(task.tgt_dict.pad()).sum(1).tolist(), reverse=True)
            first = 0
            for size in group_sizes(lengths, decoder.packed_groups):
                grids["positions"] += size * lengths[first]
                grids["scores"] += size * lengths[first] ** 2
                first += size
            grids["tokens"] += sum(lengths)
            grids["one grid's scores"] += len(lengths) * lengths[0] ** 2
    padding = {f"padding_{side}": pad[side] / total[side] for side in pad}
    if packed:
        padding["padding_packed_grids"] = 1 - grids["tokens"] / grids["positions"]
        padding["packed_scores"] = grids["scores"] / grids["one grid's scores"]
    return len(batches), len(shapes), {"padding": sum(pad.values()) / sum(total.values()), **padding}


def time_shares(prof, top=8):
    """The update's CPU time (ms) and the share of it each of its TOP ops took (self time)."""
    ops = [e for e in prof.key_averages() if e.key.startswith(("aten::", "mkldnn::"))]
    total = sum(e.self_cpu_time_total for e in ops)
    ops.sort(key=lambda e: -e.self_cpu_time_total)
    return {"op_ms": round(total / 1e3, 1),
            "top_ops": {e.key: round(e.self_cpu_time_total / total, 3) for e in ops[:top]}}


REGION = "qknorm_region:"


def regioned(name, fn):
    def wrapped(*args, **kwargs):
        with torch.profiler.record_function(REGION + name):
            return fn(*args, **kwargs)
    return wrapped


def op_families(events, wall_ms):
    """{family: ms} of a profiled update (EVENTS: torch.profiler's events) whose wall time was
    WALL_MS; the families add up to it."""
    by_name = {n if "::" in n else "aten::" + n: family for family, names in FAMILIES.items() for n in names}
    ms = dict.fromkeys([*FAMILIES, ELEMENTWISE, COMPILED, OPTIMIZER], 0.0)

    def region(e):
        while e is not None:
            if e.name.startswith(REGION):
                return e
            e = e.cpu_parent
        return None

    for e in events:
        if e.name.startswith(REGION) and region(e.cpu_parent) is None:
            ms[REGIONS[e.name[len(REGION):]]] += e.cpu_time_total / 1e3
        elif (e.name.startswith("aten::") or e.name in by_name) and region(e) is None:
            ms[by_name.get(e.name, ELEMENTWISE)] += e.self_cpu_time_total / 1e3
        elif e.name.startswith(COMPILED_EVENT) and region(e) is None:
            ms[COMPILED] += e.self_cpu_time_total / 1e3
    ms[FRAMEWORK] = wall_ms - sum(ms.values())
    return {k: round(v, 1) for k, v in ms.items()}


def profiled(trainer, original, samples, raise_oom):
    """(train_step's result, what the profile of that update says of its time)."""
    from qknorm_fairseq import fast_dropout, fused_kernels

    saved = (trainer.clip_grad_norm, trainer.optimizer.step, fast_dropout.keep_mask, fast_dropout.kernel,
             fused_kernels.kernel, fused_kernels.softmax_kernel, fused_kernels.layer_norm_kernel,
             fused_kernels.loss_kernel, fused_kernels.weight_grad_kernel)
    trainer.clip_grad_norm = regioned("clip", trainer.clip_grad_norm)
    trainer.optimizer.step = regioned("step", trainer.optimizer.step)
    fast_dropout.keep_mask = regioned("keep_mask", fast_dropout.keep_mask)
    fast_dropout.kernel = regioned("kernel", fast_dropout.kernel)
    fused_kernels.kernel = regioned("l2_kernel", fused_kernels.kernel)
    fused_kernels.softmax_kernel = regioned("softmax_kernel", fused_kernels.softmax_kernel)
    fused_kernels.layer_norm_kernel = regioned("layer_norm_kernel", fused_kernels.layer_norm_kernel)
    fused_kernels.loss_kernel = regioned("loss_kernel", fused_kernels.loss_kernel)
    fused_kernels.weight_grad_kernel = regioned("weight_grad_kernel", fused_kernels.weight_grad_kernel)
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            start = time.perf_counter()
            result = original(trainer, samples, raise_oom)
            wall_ms = (time.perf_counter() - start) * 1e3
    finally:
        (trainer.clip_grad_norm, trainer.optimizer.step, fast_dropout.keep_mask, fast_dropout.kernel,
         fused_kernels.kernel, fused_kernels.softmax_kernel, fused_kernels.layer_norm_kernel,
         fused_kernels.loss_kernel, fused_kernels.weight_grad_kernel) = saved
    return result, {"update_ms": round(wall_ms, 1), **time_shares(prof),
                    "op_families": op_families(prof.events(), wall_ms)}


def watch(trainer_cls, update, out):
    original = trainer_cls.train_step

    timed = {}

    def train_step(self, samples, raise_oom=False):
        if self.get_num_updates() + 2 == update:  # the update before: where its time goes, undisturbed
            result, times = profiled(self, original, samples, raise_oom)
            timed.update(times)
            return result
        if self.get_num_updates() + 1 != update:
            return original(self, samples, raise_oom)
        counter = OpCounter()
        crit, opt = self.criterion, self.optimizer
        saved = crit.forward, opt.backward, self.clip_grad_norm, opt.step
        crit.forward = phased(counter, "forward", crit.forward)
        opt.backward = phased(counter, "backward", opt.backward)
        self.clip_grad_norm = phased(counter, "clip", self.clip_grad_norm)
        opt.step = phased(counter, "step", opt.step)
        try:
            with counter:
                result = original(self, samples, raise_oom)
        finally:
            crit.forward, opt.backward, self.clip_grad_norm, opt.step = saved
        batches, shapes, padding = epoch_shapes(self)
        ops = dict(counter.ops, total=sum(counter.ops.values()))
        by_name = {}
        for (phase, name), n in counter.by_name.most_common():
            by_name.setdefault(phase, {})[name] = n
        record = {"update": update, "ops": ops, "ops_by_name": by_name,
                  "syncs": sum(s["kind"] == "sync" for s in counter.syncs),
                  "h2d": sum(s["kind"] == "h2d" for s in counter.syncs), "sync_sites": counter.syncs,
                  "batches_per_epoch": batches, "shapes_per_epoch": shapes, **padding,
                  "logging_update": update % self.cfg.common.log_interval == 0, **timed}
        with open(out, "w", encoding="utf-8") as f:
            json.dump(record, f, indent=1)
        return result

    trainer_cls.train_step = train_step


def main(argv=None):
    program = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv or argv.index("--") < 1:
        sys.exit("usage: python -m qknorm_pipeline.benchmark.step_profile OUT.json [--plain] [--update K] -- ARGS")
    ours, args = argv[:argv.index("--")], argv[argv.index("--") + 1:]
    out, plain = ours[0], "--plain" in ours
    if program:  # started as a program: the allocator the training would have (allocator.py)
        from ..allocator import restart_with_allocator

        try:
            restart_with_allocator(args)
        except ValueError as e:
            sys.exit(f"[step_profile] error: {e}")
    update = int(ours[ours.index("--update") + 1]) if "--update" in ours else 6
    from fairseq.trainer import Trainer

    watch(Trainer, update, out)  # FastTrainer inherits train_step
    sys.argv = [sys.argv[0], *args]
    if plain:
        from fairseq_cli.train import cli_main

        cli_main()
    else:
        from .. import fairseq_train
        from ..hardware import cpu_has_bf16

        if "--bf16" in args and "--cpu" in args and not cpu_has_bf16():
            print("[step_profile] this CPU emulates bf16: the op and sync counts are those of any CPU, op_ms and "
                  "top_ops are not", file=sys.stderr)
            fairseq_train.EMULATED_BF16_OK = True
        fairseq_train.main(args)


if __name__ == "__main__":
    main()
