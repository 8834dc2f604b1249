"""fairseq's Trainer without its per-update host syncs, and with one flat fp32 master under --bf16.

Used by `python -m qknorm_pipeline.fairseq_train` (what scripts/train.sh runs); plain `fairseq-train`
keeps fairseq's Trainer. The arithmetic of an update is unchanged; what changes:

- Logging. fairseq turns every update's meters into rounded Python numbers (`get_smoothed_values`,
  one `.item()` per meter) and checks `isfinite(grad_norm)` a second time, although fairseq-train
  prints them only every --log-interval updates; on a GPU each is a host-device sync. Here the
  meters are read on logging updates only, and the clip meter is built without two small
  host-to-device copies. The one remaining sync of an update is fairseq's own check that the
  gradient norm is finite (it raises on NaN/Inf, as before).
- --bf16 master weights. fairseq keeps one fp32 copy per parameter under --bf16 (it never flattens
  bf16: a TPU choice), so every update copies, scales, clips and steps ~100 tensors one by one.
  With an optimizer that supports flat parameters (multi_tensor_adam, adam) the master here is one
  flat fp32 tensor: gradients are copied into it with one multi-tensor copy (so zero_grad leaves it
  as it is; only a parameter without a gradient gets zeros), clipped with one norm, stepped as one
  tensor, and copied back with one multi-tensor copy. Same formula; a checkpoint's
  optimizer state is then one flat tensor, like fairseq's flat --fp16 state. With --fused-adam on a
  CPU the norm, the step and both copies are one C loop each over the bf16 gradients
  (optimizer.flat_bf16_step).
"""
import logging
from unittest import mock

import torch
from fairseq import optim
from fairseq.logging import metrics
from fairseq.optim.fp16_optimizer import FP16Optimizer
from fairseq.trainer import Trainer

from . import optimizer as multi_tensor_adam

logger = logging.getLogger(__name__)


class FlatBF16Optimizer(FP16Optimizer):
    """fairseq's FP16Optimizer (bf16: no loss scaling) over one flat fp32 master tensor."""

    @classmethod
    def build_optimizer(cls, cfg, params, **kwargs):
        flat = torch.nn.Parameter(torch.cat([p.data.float().reshape(-1) for p in params]))
        flat.grad = torch.zeros_like(flat)
        fp32_optimizer = optim.build_optimizer(cfg.optimizer, [flat])
        if not fp32_optimizer.supports_flat_params:
            raise ValueError(f"--optimizer {cfg.optimizer._name} does not support one flat master tensor under --bf16; "
                             "use --optimizer multi_tensor_adam")
        return cls(cfg, params, fp32_optimizer, flat, **kwargs)

    def __init__(self, cfg, params, fp32_optimizer, fp32_params, **kwargs):
        super().__init__(cfg, params, fp32_optimizer, fp32_params, **kwargs)
        sizes = [p.numel() for p in params]
        self._master = [t.view_as(p) for t, p in zip(fp32_params.data.split(sizes), params)]
        self._master_grads = [t.view_as(p) for t, p in zip(fp32_params.grad.split(sizes), params)]
        self._master_grads_stale = False  # True from zero_grad to the next sync (it zeroes no memory)

    @property
    def supports_step_with_scale(self):
        # read by fairseq's FP16Optimizer.step (getattr): pass the factor to an optimizer that takes it
        return self.fp32_optimizer.supports_step_with_scale

    def _native(self):
        """The bf16 weights and gradients where --fused-adam's C loops take the step (CPU bf16 weights and
        gradients, contiguous; the library built), else None."""
        adam = getattr(self.fp32_optimizer, "_optimizer", None)
        if not (isinstance(adam, multi_tensor_adam.MultiTensorAdam) and adam.fused and self.scaler is None):
            return None
        weights, grads = self.fp16_params, [p.grad for p in self.fp16_params]
        if not all(t.device.type == "cpu" and t.dtype == torch.bfloat16 and t.is_contiguous()
                   for t in weights + [g for g in grads if g is not None]):
            return None
        if multi_tensor_adam.adam_library() is None:
            return None
        return weights, grads

    def clip_grad_norm(self, max_norm, aggregate_norm_fn=None):
        native = self._native()
        if native is None:
            return super().clip_grad_norm(max_norm, aggregate_norm_fn)
        # fairseq's clip_grad_norm without the copy into the master's gradient (scaler: None under bf16)
        norm = multi_tensor_adam.grad_norm(*native)
        grad_norm = self._multiply_factor * (norm if aggregate_norm_fn is None else aggregate_norm_fn(norm))
        if max_norm > 0.0:
            self._multiply_factor *= (max_norm / (grad_norm + 1e-6)).clamp_(max=1)
        return grad_norm

    def step(self, closure=None, groups=None):
        native = self._native()
        if native is not None and closure is None and groups is None:
            self.fp32_optimizer._optimizer.flat_bf16_step(*native, self._multiply_factor)
        else:
            super().step(closure, groups)
        # fairseq resets the factor where it multiplies the gradients by it (_unscale_grads), which a
        # step with scale skips: without this, every update's clipping would compound into the next
        self._multiply_factor = 1.0

    def zero_grad(self):
        # fairseq zeroes the whole flat master gradient here, a pass over every parameter that the
        # copy after backward then overwrites: only what that copy does not write is zeroed, there
        for p in self.fp16_params:
            p.grad = None
        self._needs_sync, self._master_grads_stale = False, True

    def _sync_fp16_grads_to_fp32(self):
        if self._needs_sync:
            pairs = [(g32, p.grad) for p, g32 in zip(self.fp16_params, self._master_grads) if p.grad is not None]
            if pairs:
                torch._foreach_copy_(*map(list, zip(*pairs)))
            missing = [g32 for p, g32 in zip(self.fp16_params, self._master_grads) if p.grad is None]
            if self._master_grads_stale and missing:  # no gradient since zero_grad: zeros
                torch._foreach_zero_(missing)
            self._needs_sync = False
        elif self._master_grads_stale:  # no backward since zero_grad
            self.fp32_params.grad.zero_()
        self._master_grads_stale = False

    @torch.no_grad()
    def _sync_fp32_params_to_fp16(self):
        torch._foreach_copy_(self.fp16_params, self._master)


def flat_bf16(cfg):
    """--bf16 with fairseq's FP16Optimizer path, where one flat master tensor is a drop-in."""
    c = cfg.common
    return c.bf16 and not (c.memory_efficient_bf16 or c.amp or cfg.optimization.use_bmuf
                           or cfg.distributed_training.ddp_backend == "fully_sharded"
                           or cfg.distributed_training.zero_sharding != "none")


class FastTrainer(Trainer):
    def _build_optimizer(self):
        if not flat_bf16(self.cfg):
            return super()._build_optimizer()
        with mock.patch.object(optim, "FP16Optimizer", FlatBF16Optimizer):
            super()._build_optimizer()
        logger.info("--bf16: one flat fp32 master tensor of "
                    f"{self._optimizer.fp32_params.numel():,} parameters (qknorm_fairseq/trainer.py)")

    def _logging_update(self):
        return self.get_num_updates() % self.cfg.common.log_interval == 0

    def _reduce_and_log_stats(self, logging_outputs, sample_size, grad_norm=None):
        if grad_norm is None or self.tpu or self.cfg.common.amp or self._logging_update():
            return super()._reduce_and_log_stats(logging_outputs, sample_size, grad_norm)
        # train_step has raised on a non-finite grad_norm already (without --amp)
        metrics.log_speed("ups", 1.0, priority=100, round=2)
        metrics.log_scalar("gnorm", grad_norm, priority=400, round=3)
        clip = self.cfg.optimization.clip_norm
        if clip > 0:
            metrics.log_scalar("clip", (grad_norm > clip).float() * 100, priority=500, round=1)
        self.task.reduce_metrics(logging_outputs, self.get_criterion())
        # fairseq-train only checks that this is not None (None: an OOM or overflow)
        return {"sample_size": sample_size}
