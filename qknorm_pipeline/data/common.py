"""Errors, log lines, split names and atomic folders shared by the data tools (reading and writing
lines: qknorm_pipeline/files.py)."""
import contextlib
import os
import shutil
import sys
import tempfile

from ..cli import UserError

SPLITS = ("train", "dev", "test")


class DataError(UserError):
    """Bad or unusable data: the message names the problem and the fix."""


class NotFound(DataError):
    pass


def log(msg):
    print(f"[corpora] {msg}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def staged_dir(out):
    """Yields a fresh temporary folder beside OUT; it replaces OUT only when the block succeeds,
    and is removed otherwise, so OUT is either the old complete folder or the new one."""
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=os.path.basename(out) + ".tmp.", dir=parent)
    try:
        yield tmp
        if os.path.exists(out):
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
