"""The identity of a result: what must be unchanged for a stored result to be reused.

    python -m qknorm_pipeline.fingerprint [--file PATH ...] -- COMMAND [ARGS...]

Prints one SHA-256 over: the content of every --file (the checkpoint, the reference, the test
data), the whole COMMAND line (every decoding flag: beam, length normalisation, search, precision,
and the scorer's settings given after it), the versions of the packages that decode and score
(PACKAGES), and the source of this package's modules on that path (CODE). scripts/evaluate.sh
stores it beside a result and decodes again whenever it differs. Imports no fairseq.
"""
import argparse
import ast
import glob
import hashlib
import os
import sys
from importlib import metadata

from .cli import Parser
from .cli import main as run_main
from .files import file_digest
from .paths import ROOT

PACKAGES = ("fairseq-fixed", "fairseq", "torch", "sacrebleu", "sacremoses", "nltk", "sentencepiece")
# the packages whose every module a decoding or a score runs: the plugin and the scorer
CODE_DIRS = ("qknorm_fairseq", "qknorm_pipeline/scoring")


def _imported(path, root):
    """The qknorm_pipeline modules that the module at PATH imports, as paths relative to ROOT."""
    package = os.path.dirname(os.path.relpath(path, root)).split(os.sep)
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            name = base + (node.module.split(".") if node.module else [])
            for alias in ([None] if node.module else []) + [a.name for a in node.names]:
                target = os.path.join(*name, *([alias] if alias else []))
                if target.startswith("qknorm_pipeline") and os.path.isfile(os.path.join(root, target + ".py")):
                    yield target + ".py"


def code_files(root=None):
    """Every .py file of CODE_DIRS under ROOT (the repository), and every qknorm_pipeline module they
    import, directly or not; sorted, relative to ROOT."""
    root = root or ROOT
    todo = [os.path.relpath(p, root) for d in CODE_DIRS
            for p in glob.glob(os.path.join(root, d, "**", "*.py"), recursive=True)]
    found = set()
    while todo:
        path = todo.pop()
        if path not in found:
            found.add(path)
            todo.extend(_imported(os.path.join(root, path), root))
    return sorted(found)


def versions():
    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def parts(files, command, root=None):
    """Everything the fingerprint covers, as a JSON-ready dict; ROOT: the repository (this one)."""
    root = root or ROOT
    return {"files": [file_digest(p) for p in files], "command": list(command), "versions": versions(),
            "code": {m: file_digest(os.path.join(root, m)) for m in code_files(root)}}


def fingerprint(files, command, root=None):
    return fingerprint_of(parts(files, command, root))


def fingerprint_of(p):
    """The SHA-256 of PARTS (parts()): a caller that needs a file's own digest too reads it once."""
    h = hashlib.sha256()
    for key in ("files", "command"):
        for item in p[key]:
            h.update(item.encode("utf-8") + b"\0")
    for table in (p["versions"], p["code"]):
        for k in sorted(table):
            h.update(f"{k}={table[k]}".encode() + b"\0")
    return h.hexdigest()


def main(argv=None):
    ap = Parser(prog="python -m qknorm_pipeline.fingerprint", description=__doc__)
    ap.add_argument("--file", action="append", default=[], metavar="PATH",
                    help="a file whose content is part of the identity (repeatable)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]: the command line")

    def run(args):
        command = args.command[1:] if args.command[:1] == ["--"] else args.command
        if not command:
            ap.error("give the command after --")
        missing = [p for p in args.file if not os.path.isfile(p)]
        if missing:
            ap.error(f"--file {missing[0]} does not exist")
        print(fingerprint(args.file, command))

    return run_main(run, ap, argv)


if __name__ == "__main__":
    sys.exit(main())
