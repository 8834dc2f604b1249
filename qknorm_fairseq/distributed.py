"""What the plugin needs under fairseq's data-parallel training (several processes, one per GPU).

- `rank_tag()` prefixes our log lines with the rank: fairseq lowers every rank but the first to
  WARNING, and the package logger is kept at INFO (see `register`), so each rank prints its own
  QKNorm g0, target-vocabulary mask and ValDecay decisions, and a log shows that they agree.
- `same_on_all_ranks(what, value)` gathers a value from every rank and raises on every rank when
  they differ, instead of letting the ranks drift apart (different LRs) or hang (one rank stopping
  while the others wait in an all-reduce). Every rank must call it at the same point.
- `check_ddp_backend(args)`: fairseq's default DDP backend wraps the model in PyTorch's
  DistributedDataParallel with `device_ids=[device_id]`, which PyTorch refuses for a CPU module.
"""
import torch.distributed as dist

CPU_DDP_BACKENDS = ("legacy_ddp", "no_c10d")


def world_size():
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank_tag():
    return f"[rank {dist.get_rank()}/{world_size()}] " if world_size() > 1 else ""


def same_on_all_ranks(what, value):
    if world_size() == 1:
        return value
    seen = [None] * world_size()
    dist.all_gather_object(seen, value)
    if any(v != seen[0] for v in seen):
        raise RuntimeError(f"{what} differs between ranks: {dict(enumerate(seen))}; every rank must see the "
                           "same data and the all-reduced validation metric")
    return value


def check_ddp_backend(args):
    backend = getattr(args, "ddp_backend", None)
    if getattr(args, "cpu", False) and world_size() > 1 and backend not in CPU_DDP_BACKENDS:
        raise ValueError(f"--ddp-backend {backend} cannot train on CPUs (PyTorch's DistributedDataParallel "
                         "refuses fairseq's device_ids for a CPU module): add --ddp-backend legacy_ddp, or "
                         "launch with python -m qknorm_pipeline.fairseq_train, which picks it on CPUs")
