"""`--optimizer multi_tensor_adam`: fairseq's Adam, computed for all parameters at once.

fairseq's `adam` (without NVIDIA's apex, which this project does not install) loops over the
parameters in Python and launches about ten small kernels per parameter tensor: several hundred
launches per update for a Transformer, which a GPU spends waiting on the host. This optimizer
applies the same update with torch's multi-tensor (`torch._foreach_*`) operations, about ten launches per
update for all parameters together, and keeps fairseq's exact formula, which differs from
torch.optim.AdamW in where eps enters:

    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;  p = p - lr wd p   (decoupled weight decay)
    p = p - lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps)

(torch adds eps to sqrt(v / (1 - b2^t)), so its eps is larger by 1 / sqrt(1 - b2^t) early in
training). Its state (step, exp_avg, exp_avg_sq per parameter) is fairseq's, though fairseq-train
refuses to resume one optimizer's checkpoint with the other (it compares the class names). The LR
scheduler and fp16/bf16 (fp32 master weights) are fairseq's, as with `adam`; the gradient norm for
clipping, one `norm` per parameter in fairseq, is one multi-tensor operation here, with the same result.

With `--fused-adam` on a CPU the update is one C loop (csrc/flat_adam.c, built by native.py). Under
`--bf16`, trainer.FlatBF16Optimizer's flat fp32 master steps in it, reading the model's bf16 gradients and
writing its bf16 weights as it goes, where fairseq's step widens the gradients into the master's, steps,
and narrows the weights back: three passes over every parameter, and two of them a copy per parameter
tensor. In fp32 every parameter tensor steps in place in one call, where the compiled loop is one call
per tensor, and the clipping factor is applied inside it, where clip_grad_norm would multiply every
gradient first. The same formula as the compiled loop, other rounding (fp32 throughout, no fused
multiply-add); the gradient norm for clipping is summed in fp64.
"""
import ctypes
import math
from collections import defaultdict
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any, List

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from omegaconf import II, OmegaConf

from . import native


@dataclass
class MultiTensorAdamConfig(FairseqDataclass):
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for the Adam optimizer"})
    adam_eps: float = field(default=1e-8, metadata={"help": "epsilon for the Adam optimizer"})
    weight_decay: float = field(default=0.0, metadata={"help": "decoupled weight decay, as fairseq's adam"})
    fused_adam: bool = field(default=False, metadata={
        "help": "the update as one loop per tensor compiled by torch.compile (a C++ compiler on a CPU), with "
                "--bf16's clipping and unscaling folded in; on a CPU the gradient norm and the update each one C loop "
                "over all parameters (under --bf16 from the bf16 gradients to the bf16 weights), the clipping folded "
                "in: the same formula, other rounding"})
    lr: List[float] = II("optimization.lr")


class MultiTensorAdam(torch.optim.Optimizer):
    """fairseq's Adam update (fairseq/optim/adam.py) with torch._foreach_* operations."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=False):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.fused = fused
        self.clip_factor = 1.0  # what FairseqMultiTensorAdam.clip_grad_norm left to the next C step to apply

    def c_steps(self, params):
        """Whether csrc/flat_adam.c steps PARAMS (with gradients) in fp32: --fused-adam, CPU fp32 parameters and
        gradients, contiguous, and the library built."""
        return self.fused and all(t.device.type == "cpu" and t.dtype == torch.float32 and t.is_contiguous()
                                  for p in params for t in (p, p.grad)) and adam_library() is not None

    @property
    def supports_memory_efficient_fp16(self):
        return False

    @property
    def supports_flat_params(self):
        return True

    @torch.no_grad()
    def step(self, closure=None, scale=None):
        """SCALE (fused only): the gradients are SCALE times the true ones (fairseq's step with scale)."""
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            # one multi-tensor call per (device, dtype) and step count (all equal unless a
            # parameter started receiving gradients late)
            buckets = defaultdict(list)
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.dtype != torch.float32:
                    raise RuntimeError(f"multi_tensor_adam needs fp32 parameters, got {p.dtype}: fairseq's --fp16 and "
                                       "--bf16 keep fp32 master weights, --memory-efficient-fp16/bf16 do not")
                if p.grad.is_sparse:
                    raise RuntimeError("multi_tensor_adam does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                buckets[(p.device, state["step"])].append(p)
            beta1, beta2 = group["betas"]
            for (_, step), ps in buckets.items():
                if self.c_steps(ps):
                    self._c_step(group, step, ps, scale)
                    continue
                if self.fused:
                    self._fused_step(group, step, ps, scale)
                    continue
                grads = [p.grad.float() for p in ps]
                exp_avgs = [self.state[p]["exp_avg"] for p in ps]
                exp_avg_sqs = [self.state[p]["exp_avg_sq"] for p in ps]
                torch._foreach_mul_(exp_avgs, beta1)
                torch._foreach_add_(exp_avgs, grads, alpha=1 - beta1)
                torch._foreach_mul_(exp_avg_sqs, beta2)
                torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
                denom = torch._foreach_sqrt(exp_avg_sqs)
                torch._foreach_add_(denom, group["eps"])
                step_size = group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
                if group["weight_decay"] != 0:
                    torch._foreach_add_(ps, ps, alpha=-group["weight_decay"] * group["lr"])
                torch._foreach_addcdiv_(ps, exp_avgs, denom, value=-step_size)
        self.clip_factor = 1.0
        return loss

    def _c_step(self, group, step, ps, scale):
        """The step of fp32 parameters PS, in place, in csrc/flat_adam.c's loop: the gradients times the
        clipping factor and 1 / SCALE on the way."""
        states = [self.state[p] for p in ps]
        for state in states:  # a checkpoint's moments may come back as other views
            state["exp_avg"], state["exp_avg_sq"] = state["exp_avg"].contiguous(), state["exp_avg_sq"].contiguous()
        beta1, beta2 = group["betas"]
        step_size = group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step)
        factor = self.clip_factor / (1.0 if scale is None else float(scale))
        adam_library().qk_adam_f32(
            len(ps), _pointers(ps), _pointers([p.grad for p in ps]), _pointers([s["exp_avg"] for s in states]),
            _pointers([s["exp_avg_sq"] for s in states]), _sizes(ps), factor, step_size, beta1, beta2, group["eps"],
            group["weight_decay"] * group["lr"], torch.get_num_threads())

    @torch.no_grad()
    def flat_bf16_step(self, weights, grads, factor):
        """The fused step of this optimizer's one flat fp32 parameter (the master of the bf16 WEIGHTS,
        end to end) from their bf16 GRADS (None: no gradient) times FACTOR, the weights written back
        rounded to bf16: csrc/flat_adam.c's loop (adam_library())."""
        (group,) = self.param_groups
        (flat,) = group["params"]
        state = self.state[flat]
        if not state:
            state.update(step=0, exp_avg=torch.zeros_like(flat), exp_avg_sq=torch.zeros_like(flat))
        state["step"] += 1
        beta1, beta2 = group["betas"]
        step_size = group["lr"] * math.sqrt(1 - beta2**state["step"]) / (1 - beta1**state["step"])
        adam_library().qk_adam_bf16(
            len(weights), _pointers(weights), _pointers(grads), _sizes(weights), flat.data_ptr(),
            state["exp_avg"].data_ptr(), state["exp_avg_sq"].data_ptr(), float(factor), step_size, beta1, beta2,
            group["eps"], group["weight_decay"] * group["lr"], torch.get_num_threads())

    def _fused_step(self, group, step, ps, scale):
        from .fused_kernels import adam_update  # imported only here: it imports torch._dynamo (2 s)

        beta1, beta2 = group["betas"]
        factor = torch.as_tensor(1.0 if scale is None else 1.0 / scale, dtype=torch.float32)
        step_size = torch.tensor(group["lr"] * math.sqrt(1 - beta2**step) / (1 - beta1**step))
        for p in ps:
            state = self.state[p]
            adam_update(p, p.grad, state["exp_avg"], state["exp_avg_sq"], factor.to(p.device), step_size.to(p.device),
                        beta1, beta2, group["eps"], group["weight_decay"] * group["lr"])


def adam_library():
    """csrc/flat_adam.c's loops, or None (a warning, once) where they cannot be built."""
    return native.kernels("flat_adam", {
        "qk_sumsq": ([ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int], ctypes.c_double),
        "qk_adam_bf16": ([ctypes.c_int] + [ctypes.c_void_p] * 6 + [ctypes.c_float] * 6 + [ctypes.c_int], None),
        "qk_adam_f32": ([ctypes.c_int] + [ctypes.c_void_p] * 5 + [ctypes.c_float] * 6 + [ctypes.c_int], None),
    }, "--fused-adam", "every tensor steps through the compiled loop (under --bf16 with fairseq's copies) instead")


def _pointers(tensors):
    return (ctypes.c_void_p * len(tensors))(*map(native.pointer, tensors))


def _sizes(tensors):
    return (ctypes.c_int64 * len(tensors))(*(t.numel() for t in tensors))


def grad_norm(weights, grads):
    """The l2 norm of GRADS (of WEIGHTS, bf16 or fp32, each a tensor or None: none), as an fp32 scalar tensor:
    csrc/flat_adam.c's sum in fp64."""
    return torch.tensor(_grad_norm(weights, grads), dtype=torch.float32)


def _grad_norm(weights, grads):
    dtype = native.DTYPES[weights[0].dtype]
    return math.sqrt(adam_library().qk_sumsq(len(grads), _pointers(grads), _sizes(weights), dtype, torch.get_num_threads()))



@register_optimizer("multi_tensor_adam", dataclass=MultiTensorAdamConfig)
class FairseqMultiTensorAdam(FairseqOptimizer):
    def __init__(self, cfg: MultiTensorAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = MultiTensorAdam(params, **self.optimizer_config, fused=getattr(cfg, "fused_adam", False))

    @property
    def supports_step_with_scale(self):
        # fairseq's FP16Optimizer then passes its clipping and unscaling factor to step() instead
        # of multiplying every gradient by it first: one pass less
        return self._optimizer.fused

    @property
    def optimizer_config(self):
        betas = self.cfg.adam_betas
        if isinstance(betas, str):  # fairseq's spelling on the command line: --adam-betas "(0.9, 0.98)"
            betas = eval(betas)
        betas = tuple(OmegaConf.to_container(betas) if OmegaConf.is_config(betas) else betas)
        lr = self.cfg.lr[0] if isinstance(self.cfg.lr, Collection) else self.cfg.lr
        return {"lr": lr, "betas": betas, "eps": self.cfg.adam_eps, "weight_decay": self.cfg.weight_decay}

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        """fairseq's utils.clip_grad_norm_ (the norm of the per-tensor fp32 norms, then every gradient
        times min(1, max_norm / (norm + 1e-6))), bit for bit, with one multi-tensor norm instead of
        one norm and one copy per parameter; where the C loop steps (c_steps), the norm summed in fp64 and
        the factor left to the step."""
        params = [p for p in self.params if p.grad is not None]
        grads = [p.grad for p in params]
        if any(hasattr(p, "expert") for p in self.params) or len(grads) < 2:
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        if self._optimizer.c_steps(params):  # the norm in fp64, the factor applied by the step
            norm = _grad_norm(params, grads)
            total_norm = torch.tensor(norm, dtype=torch.float32)
            if aggregate_norm_fn is not None:
                total_norm = aggregate_norm_fn(total_norm)
                norm = float(total_norm)
            if max_norm > 0:
                self._optimizer.clip_factor = min(1.0, max_norm / (norm + 1e-6))
            return total_norm
        total_norm = torch.norm(torch.stack(torch._foreach_norm(grads, dtype=torch.float32)))
        if aggregate_norm_fn is not None:
            total_norm = aggregate_norm_fn(total_norm)
        if max_norm > 0:
            torch._foreach_mul_(grads, (max_norm / (total_norm + 1e-6)).clamp_(max=1))
        return total_norm
