"""Where things are: the repository, the output folders (each movable by an environment variable),
and paths as they go into shareable results (relative to the repository, never this machine's)."""
import dataclasses
import os
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "qknorm_fairseq")  # the plugin, given to fairseq as --user-dir
CONFIG_DIR = os.environ.get("QKNORM_CONFIG_DIR", os.path.join(ROOT, "configs"))


@dataclasses.dataclass(frozen=True)
class Folders:
    """downloads and tokenized text, binarized data, checkpoints, training logs, results."""

    data: str
    data_bin: str
    ckpt: str
    logs: str
    results: str

    def under(self, name):
        """The same folders, each with a subfolder NAME (a study keeps its runs apart this way)."""
        return Folders(*(os.path.join(p, name) for p in dataclasses.astuple(self)))


def folders():
    """$DATA_DIR (data/), $DATA_BIN (data-bin/), $CKPT_DIR (checkpoints/), $LOG_DIR (logs/),
    $RESULTS_DIR (results/), each relative to the repository unless the variable is set."""
    def get(var, default):
        return os.path.abspath(os.environ.get(var) or os.path.join(ROOT, default))

    return Folders(get("DATA_DIR", "data"), get("DATA_BIN", "data-bin"), get("CKPT_DIR", "checkpoints"),
                   get("LOG_DIR", "logs"), get("RESULTS_DIR", "results"))


def shareable(path):
    """`path` relative to the repository when it lies inside it; anything else unchanged."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def shareable_text(text):
    """TEXT (a log) without this machine's paths: the repository's made relative to it, then (a
    traceback's frames) installed packages' as $SITE, the standard library's as $STDLIB, the home
    folder's as ~; the longest prefix first, since site-packages often lies inside the stdlib's."""
    text = text.replace(ROOT + os.sep, "")
    prefixes = {sysconfig.get_path("purelib"): "$SITE", sysconfig.get_path("platlib"): "$SITE",
                sysconfig.get_path("stdlib"): "$STDLIB", os.path.expanduser("~"): "~"}
    for prefix in sorted(prefixes, key=len, reverse=True):
        if len(prefix) > 1:
            text = text.replace(prefix + os.sep, prefixes[prefix] + os.sep)
    return text


def redo(folder, pair):
    """How to remake FOLDER, a stage of PAIR's prepared data (tokenized text or binarized data) that
    a stage after it cannot read: the stage is redone when its folder is gone."""
    where, full = folders(), os.path.abspath(folder)
    own = os.path.dirname(full) in (where.data_bin, os.path.join(where.data, pair))
    again = f"bash scripts/prepare.sh --pair {pair}" + ("" if own else "; a study's data: its study.sh command")
    return f"delete {shareable(folder)} and prepare it again ({again})"


def short(path):
    """PATH as a user reads it: relative to the current folder when inside it."""
    full, here = os.path.abspath(path), os.getcwd()
    return os.path.relpath(full, here) if full.startswith(here + os.sep) else path
