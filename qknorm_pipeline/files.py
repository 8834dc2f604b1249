"""Reading and writing the project's text files. Imports no fairseq.

Lines are cut at "\\n" only (split_lines). Every file or folder a tool writes appears complete or
not at all: it is written under a temporary name and renamed into place only when complete
(atomic_path for a file, atomic_dir for a folder), so a later stage never mistakes a half-written
result for a finished one.
"""
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
import zipfile

from .cli import UserError


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
        try:
            text = f.read()
        except UnicodeDecodeError as e:
            raise UserError(f"{path} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}): convert it, "
                            "e.g. iconv -f LATIN1 -t UTF-8 FILE > FILE.utf8") from None
    if "\n" not in text and text.count("\r") > 1:
        raise UserError(f"{path} ends its lines with a bare carriage return (\\r, old Mac OS line endings), which "
                        "would make it one line: convert it, e.g. tr '\\r' '\\n' < FILE > FILE.unix")
    return split_lines(text)


def count_lines(path):
    """The lines of PATH as split_lines cuts them (at "\\n" only; a last line without one counts),
    without holding the file in memory."""
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def read_json(path, fix, kind=dict):
    """The JSON value of PATH, of type KIND; a file that does not hold one (cut short, edited by
    hand) is a UserError naming it and FIX (what remakes it)."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        problem = f"not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})"
    else:
        if isinstance(value, kind):
            return value
        problem = f"holds a {type(value).__name__}, not a {kind.__name__}"
    raise UserError(f"{path}: {problem}: {fix}")


@contextlib.contextmanager
def atomic_path(path):
    """Yields a temporary path beside PATH; it replaces PATH when the block succeeds and is
    removed otherwise."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


@contextlib.contextmanager
def atomic_dir(path, stage_in=None):
    """Yields a fresh temporary folder in STAGE_IN (default: beside PATH, on the same file system);
    it replaces the folder PATH when the block succeeds and is removed otherwise, so PATH is either
    the old complete folder or the new one."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    stage_in = stage_in or os.path.dirname(os.path.abspath(path))
    os.makedirs(stage_in, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp.", dir=stage_in)
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # a folder as os.makedirs makes it, not mkdtemp's private 0700
    try:
        yield tmp
        if os.path.exists(path):
            shutil.rmtree(path)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            shutil.rmtree(tmp)


@contextlib.contextmanager
def locked(folder, busy):
    """Holds an exclusive lock on FOLDER while the block runs (released when the process ends, however
    it ends). When another process holds it, BUSY() is called: it raises to refuse, or returns (having
    said so) to wait for the lock."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            busy()
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def write_atomic(path, text):
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)


def write_lines(path, lines):
    write_atomic(path, "".join(line + "\n" for line in lines))


def file_digest(path, algorithm="sha256"):
    """The hex digest of PATH's content (a download's checksum, a result's checkpoint and fingerprint)."""
    with open(path, "rb") as f:
        return hashlib.file_digest(f, algorithm).hexdigest()


def is_whole_checkpoint(path):
    """PATH could be a whole torch.save file: torch.save writes a zip archive, whose directory comes
    last (a file cut short by a full disk or an interrupted copy has none); before torch 1.6, a pickle."""
    if zipfile.is_zipfile(path):
        return True
    with open(path, "rb") as f:
        return f.read(1) == b"\x80"
