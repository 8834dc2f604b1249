"""qknorm-fairseq: a fairseq plugin (`--user-dir qknorm_fairseq`). Importing it registers the model
`qknorm_transformer` and its presets, the criterion, the task and the LR scheduler."""
# isort: skip_file  (the order matters: fairseq's import-time quirks are undone first, the model
# is registered before its presets)
from . import (
    architectures,  # noqa: F401
    checkpoint_compat,  # noqa: F401  (lets torch >= 2.6 load fairseq checkpoints)
    criterion,  # noqa: F401
    fairseq_quirks,  # noqa: F401
    lr_scheduler,  # noqa: F401
    model,  # noqa: F401
    task,  # noqa: F401
)
