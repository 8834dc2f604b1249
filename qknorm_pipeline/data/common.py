"""Errors, log lines and split names shared by the data tools (files and folders written whole:
qknorm_pipeline/files.py)."""
from ..cli import UserError
from ..cli import log as tool_log

# Our three splits, as the corpora name them (data/PAIR/raw/, --src-dir), each with the name
# fairseq gives it from tokenization on (tok/, bpe/, data-bin/: fairseq-preprocess --validpref).
FAIRSEQ_SPLIT = {"train": "train", "dev": "valid", "test": "test"}
SPLITS = tuple(FAIRSEQ_SPLIT)


class DataError(UserError):
    """Bad or unusable data: the message names the problem and the fix."""


class NotFound(DataError):
    pass


def log(msg):
    """A line of scripts/download.sh, the tool that fetches and reads the sources."""
    tool_log("download", msg)
