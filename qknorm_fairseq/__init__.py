"""qknorm-fairseq: a fairseq --user-dir plugin. Importing it registers everything with fairseq.

Exception: `python -m qknorm_fairseq.<tool>` (recipes, scoring, corpora, ...) skips the
registration unless fairseq is already loaded, so tools that never touch a model do not pay
fairseq's import time; tools that load checkpoints call `qknorm_fairseq.register()`.
"""
import logging
import os
import sys


def quiet_loggers():
    """fairseq.tasks.text_to_speech logs "Please install tensorboardX" at INFO on every import of fairseq."""
    logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)


def register():
    """Register models, presets, criterion, task and LR scheduler with fairseq (idempotent)."""
    quiet_loggers()
    # Importing fairseq runs fairseq/models/wav2vec/wav2vec2_classification.py, which calls
    # logging.basicConfig(level=DEBUG): every library's DEBUG records (matplotlib's font search:
    # hundreds of lines) would then reach stderr. The root logger is put back as it was.
    root = logging.getLogger()
    level, handlers = root.level, root.handlers[:]
    from . import checkpoint_compat  # noqa: F401  (first: lets torch >= 2.6 load fairseq checkpoints)
    from . import model, architectures, criterion  # noqa: F401  (model before its presets)
    from . import lr_scheduler, task  # noqa: F401  (val_decay scheduler, translation_qk task)
    from fairseq import utils

    root.setLevel(level)
    root.handlers[:] = handlers

    # fairseq sets every rank but the first to WARNING; our few INFO lines (QKNorm g0, the target
    # vocabulary mask, ValDecay's decisions) carry the rank and are kept on every rank.
    logging.getLogger(__name__).setLevel(logging.INFO)

    # fairseq's import_user_module refuses a second --user-dir whose folder is also named
    # "qknorm_fairseq" once the module is imported; recording our own path in its memo makes
    # `import qknorm_fairseq` followed by `--user-dir <this folder>` a no-op instead of an error.
    memo = getattr(utils.import_user_module, "memo", set())
    memo.add(os.path.dirname(os.path.abspath(__file__)))
    utils.import_user_module.memo = memo


# While `python -m pkg.module` imports pkg, sys.argv[0] is "-m" (see the docs of -m).
if not (sys.argv[:1] == ["-m"] and "fairseq" not in sys.modules):
    register()
