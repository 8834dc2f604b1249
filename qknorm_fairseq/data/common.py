"""Errors, log lines, split names, line reading and atomic folders shared by the data tools."""
import contextlib
import os
import shutil
import sys
import tempfile

SPLITS = ("train", "dev", "test")


class DataError(Exception):
    """Bad or unusable data: the message names the problem and the fix."""


class NotFound(DataError):
    pass


def log(msg):
    print(f"[corpora] {msg}", file=sys.stderr, flush=True)


def split_lines(text):
    """TEXT cut at "\\n" only; a final "\\n" ends the last line and a "\\r" before it is dropped
    (CRLF files). str.splitlines() would also cut at \\x0b, \\x0c, \\x1c-\\x1e, \\x85, \\u2028 and
    \\u2029, which occur inside real sentences and would misalign the two sides."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line[:-1] if line.endswith("\r") else line for line in lines]


def read_lines(path):
    # newline="": no universal-newline translation, a lone "\r" stays inside its sentence
    with open(path, encoding="utf-8", newline="") as f:
        return split_lines(f.read())


def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="") as f:
        f.writelines(line + "\n" for line in lines)


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
