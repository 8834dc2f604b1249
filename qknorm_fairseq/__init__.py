"""qknorm-fairseq: a fairseq plugin (`--user-dir qknorm_fairseq`). Importing it registers the model
`qknorm_transformer` and its presets, the criterion, the task, the LR scheduler and the optimizer.
The order matters (ruff's import sorting is off for this file): fairseq's import-time side effects
are undone first, and the model is registered before its presets."""
from . import fairseq_quirks  # noqa: F401
from . import clean_exit  # noqa: F401  (fairseq's prefetch thread stopped before exit)
from . import cudnn_attention  # noqa: F401  (no per-shape cuDNN attention plans on GPUs)
from . import checkpoint_compat  # noqa: F401  (lets torch >= 2.6 load fairseq checkpoints)
from . import model  # noqa: F401
from . import architectures  # noqa: F401
from . import criterion  # noqa: F401
from . import lr_scheduler  # noqa: F401
from . import optimizer  # noqa: F401
from . import task  # noqa: F401
