"""Side effects of importing fairseq that a plugin user should not see, undone once, here.

- fairseq/models/wav2vec/wav2vec2_classification.py calls logging.basicConfig(level=DEBUG) at
  import time: every library's DEBUG records (matplotlib's font search: hundreds of lines) would
  then reach stderr. The root logger is put back as it was.
- fairseq.tasks.text_to_speech logs "Please install tensorboardX" at INFO on every import.
- fairseq silences every rank but the first (WARNING); our few INFO lines (QKNorm g0, the target
  vocabulary mask, ValDecay's decisions) carry the rank and are kept on every rank.
- fairseq's import_user_module refuses a second --user-dir whose folder is also named
  "qknorm_fairseq" once the package is imported; recording our own path in its memo makes
  `import qknorm_fairseq` followed by `--user-dir <this folder>` a no-op instead of an error,
  whichever symbolic links either path goes through (the memo compares real paths).
"""
import logging
import os

_root = logging.getLogger()
_level, _handlers = _root.level, _root.handlers[:]
logging.getLogger("fairseq.tasks.text_to_speech").setLevel(logging.WARNING)
import fairseq  # noqa: E402
from fairseq import utils  # noqa: E402

_root.setLevel(_level)
_root.handlers[:] = _handlers
logging.getLogger("qknorm_fairseq").setLevel(logging.INFO)


class _RealPaths(set):
    """fairseq's memo of imported --user-dir folders, each held and looked up by its real path."""

    def add(self, path):
        super().add(os.path.realpath(path))

    def __contains__(self, path):
        return super().__contains__(os.path.realpath(path))


utils.import_user_module.memo = _RealPaths(map(os.path.realpath, getattr(utils.import_user_module, "memo", ())))
utils.import_user_module.memo.add(os.path.dirname(__file__))
del fairseq
