"""qknorm-fairseq: a fairseq plugin (`--user-dir qknorm_fairseq`). Importing it registers the model
`qknorm_transformer` and its presets, the criterion, the task, the LR scheduler and the optimizer."""
from . import (  # noqa: F401  (the model before its presets)  # noqa: F401
    architectures,
    checkpoint_compat,  # noqa: F401  (lets torch >= 2.6 load fairseq checkpoints)
    criterion,
    fairseq_quirks,  # noqa: F401  (first: imports fairseq, undoing its import-time side effects)
    lr_scheduler,
    model,
    task,
)
