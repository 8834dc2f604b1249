"""ValDecay, the validation-based learning-rate schedule of "Transformers without Tears".

    lr(n) = init + n * (peak - init) / warmup      for n < warmup (linear warmup)
    lr(n) = peak * decay ** k                      afterwards, k = decays so far

After every validation past warmup, the LR is multiplied by `--decay-factor` (0.8) when the
validation metric is worse than every one of the previous `--decay-patience` (3) values:
below their minimum when higher is better (`--maximize-best-checkpoint-metric`, e.g. BLEU),
above their maximum when lower is better (loss). Validations made during warmup enter the
history but never trigger a decay. The peak is `--lr` (TwT's rule, lambda * d^-0.5 * warmup^-0.5,
is computed by the recipes: qknorm_pipeline/recipes.py). NOWARMUP: `--warmup-updates 0 --lr 3e-4`.

Stopping: training ends once the LR is below a minimum (each procedure's: configs/base.yaml,
stopping:). Use `--decay-stop-lr`, not fairseq's `--stop-min-lr`: fairseq compares
`lr <= --stop-min-lr` at start-up and at every end of a pass over the data, warmup included, so a
warmup from 0 would end training before it starts (this scheduler refuses that combination with an
error). With `--decay-stop-lr`, the validation whose decay takes the LR strictly below the minimum
ends training: the scheduler sets the run's `max_update` to the current update, so fairseq-train
performs one more update, validates, saves and stops.

Which validations it sees: fairseq itself calls `step(epoch, val)` once per pass over the
training data. With the `translation_qk` task (qknorm_fairseq/task.py) every validation,
including `--validate-interval-updates` ones, reaches `on_validation` through the task's
`post_validate` hook; `step` then skips the end-of-pass value it has already seen.
"""
import json
import logging
import weakref
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import List

from fairseq.dataclass import FairseqDataclass
from fairseq.optim.lr_scheduler import FairseqLRScheduler, register_lr_scheduler
from omegaconf import II

from .distributed import rank_tag, same_on_all_ranks

logger = logging.getLogger(__name__)

# The scheduler of this process's trainer, for the task's post_validate hook (fairseq gives
# the task no handle on the trainer). One trainer per process, also under distributed training.
_ACTIVE = None


def active_scheduler():
    """The ValDecaySchedule built last in this process, or None."""
    return _ACTIVE() if _ACTIVE is not None else None


@dataclass
class ValDecayConfig(FairseqDataclass):
    warmup_updates: int = field(default=0, metadata={"help": "linear warmup over the first N updates (0: NOWARMUP)"})
    warmup_init_lr: float = field(
        default=-1, metadata={"help": "LR at update 0; default 0 with warmup, the peak without"}
    )
    decay_factor: float = field(default=0.8, metadata={"help": "multiply the LR by this on a bad validation"})
    decay_patience: int = field(
        default=3, metadata={"help": "decay when the metric is worse than each of the previous N validations"}
    )
    decay_stop_lr: float = field(
        default=-1, metadata={"help": "stop training once a decay takes the LR below this (the TwT paper: 1e-6, its code: 5e-5); -1: never"}
    )
    lr: List[float] = II("optimization.lr")
    maximize_best_checkpoint_metric: bool = II("checkpoint.maximize_best_checkpoint_metric")
    best_checkpoint_metric: str = II("checkpoint.best_checkpoint_metric")
    stop_min_lr: float = II("optimization.stop_min_lr")


@register_lr_scheduler("val_decay", dataclass=ValDecayConfig)
class ValDecaySchedule(FairseqLRScheduler):
    def __init__(self, cfg: ValDecayConfig, optimizer):
        super().__init__(cfg, optimizer)
        global _ACTIVE
        lrs = list(cfg.lr) if isinstance(cfg.lr, Collection) else [cfg.lr]
        if len(lrs) > 1:
            raise ValueError(f"val_decay takes one --lr value, got {lrs}")
        if cfg.warmup_updates < 0:
            raise ValueError(f"--warmup-updates must be >= 0, got {cfg.warmup_updates}")
        if not 0 < cfg.decay_factor <= 1:
            raise ValueError(f"--decay-factor must be in (0, 1], got {cfg.decay_factor}")
        if cfg.decay_patience < 1:
            raise ValueError(f"--decay-patience must be >= 1, got {cfg.decay_patience}")
        self.peak = lrs[0]
        self.init_lr = cfg.warmup_init_lr if cfg.warmup_init_lr >= 0 else (0.0 if cfg.warmup_updates > 0 else self.peak)
        self.flat_lr = self.peak  # LR after warmup, decayed in place
        self.history = []  # every validation metric seen, in order
        self.decay_updates = []  # num_updates at which each decay fired
        self.last_val_update = None  # num_updates of the last validation consumed
        self.num_updates = 0
        self.lr = None
        self.step_update(0)
        if cfg.stop_min_lr >= 0 and self.lr <= cfg.stop_min_lr:
            raise ValueError(
                f"--stop-min-lr {cfg.stop_min_lr} is not below val_decay's LR at update 0 ({self.lr:.3g}): "
                "fairseq-train would stop before training (it checks the LR at start-up and after every pass, "
                f"warmup included). Drop --stop-min-lr and use --decay-stop-lr {cfg.stop_min_lr} instead")
        _ACTIVE = weakref.ref(self)

    def should_stop(self):
        return self.flat_lr < self.cfg.decay_stop_lr

    def _request_stop(self, num_updates):
        # fairseq gives a scheduler no way to end training mid-pass; its loop stops once
        # num_updates >= cfg.optimization.max_update, read from the run's config after every update.
        root = self.cfg._get_parent() if hasattr(self.cfg, "_get_parent") else None
        if root is None or "optimization" not in root:
            raise RuntimeError("val_decay: --decay-stop-lr needs the scheduler built by fairseq-train")
        current = root.optimization.max_update
        if not current or current > num_updates:
            root.optimization.max_update = current = num_updates
        logger.info(f"{rank_tag()}val_decay: LR {self.flat_lr:.6g} < --decay-stop-lr {self.cfg.decay_stop_lr}: "
                    f"stopping training (max_update {current})")

    # --- the rule -------------------------------------------------------------------
    def _worse_than_all(self, value, previous):
        if self.cfg.maximize_best_checkpoint_metric:
            return value < min(previous)
        return value > max(previous)

    def on_validation(self, value, num_updates):
        """Record one validation metric; decay the LR when the rule says so."""
        value = float(value)
        # Under data-parallel training every rank must take the same decision: the metric is
        # fairseq's all-reduced one, and a rank-local value would make the ranks' LRs drift apart.
        same_on_all_ranks("val_decay's validation (update, metric)", (int(num_updates), value))
        patience = self.cfg.decay_patience
        previous = self.history[-patience:]
        decay = (
            num_updates >= self.cfg.warmup_updates
            and len(previous) == patience
            and self._worse_than_all(value, previous)
        )
        self.history.append(value)
        self.last_val_update = num_updates
        if self.best is None:
            self.best = value
        else:
            self.best = max(self.best, value) if self.cfg.maximize_best_checkpoint_metric else min(self.best, value)
        metric = self.cfg.best_checkpoint_metric
        if decay:
            self.flat_lr *= self.cfg.decay_factor
            self.decay_updates.append(num_updates)
            logger.info(f"{rank_tag()}val_decay: update {num_updates} {metric} {value} worse than each of the "
                        f"previous {patience} {previous}: LR -> {self.flat_lr:.6g}")
            if self.should_stop():
                self._request_stop(num_updates)
        else:
            logger.info(f"{rank_tag()}val_decay: update {num_updates} {metric} {value}: LR kept")
        return self.step_update(num_updates)

    # --- fairseq's hooks ------------------------------------------------------------
    def step(self, epoch, val_loss=None):
        """End of a pass over the data. Skips a value already fed by the task's hook."""
        if val_loss is not None and self.last_val_update != self.num_updates:
            self.on_validation(val_loss, self.num_updates)
        return self.optimizer.get_lr()

    def step_update(self, num_updates):
        self.num_updates = num_updates
        warmup = self.cfg.warmup_updates
        if num_updates < warmup:
            self.lr = self.init_lr + num_updates * (self.peak - self.init_lr) / warmup
        else:
            self.lr = self.flat_lr
        self.optimizer.set_lr(self.lr)
        return self.lr

    def state_dict(self):
        return {
            "best": self.best,
            "flat_lr": self.flat_lr,
            "history": list(self.history),
            "decay_updates": list(self.decay_updates),
            "last_val_update": self.last_val_update,
            "num_updates": self.num_updates,
        }

    def load_state_dict(self, state_dict):
        self.best = state_dict["best"]
        self.flat_lr = state_dict["flat_lr"]
        self.history = list(state_dict["history"])
        self.decay_updates = list(state_dict["decay_updates"])
        self.last_val_update = state_dict["last_val_update"]
        self.step_update(state_dict["num_updates"])
        logger.info(f"val_decay: restored state {json.dumps(self.state_dict())}")
        if self.should_stop():  # resuming a run that had already reached its minimum LR
            self._request_stop(state_dict["num_updates"])
