"""Run names: how train.sh and the studies name a run, and how the comparison reads a seed back.

    SYSTEM[_SCHEDULE][_lrL | _lrMx][_seedK]

_SCHEDULE: train.sh --schedule; _lrL: a peak LR of a study's grid (lr_tag); _lrMx: M times the
recipe's peak LR; _seedK: fairseq's --seed K, for K other than 1 (the plain name is seed 1).
"""
import re

SEED = re.compile(r"^(?P<variant>.+)_seed(?P<seed>[0-9]+)$")


FOLDER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$")
PAIR = re.compile(r"([A-Za-z_]+)-([A-Za-z_]+)")  # a pair of your own: SRC-TGT, its files' language codes


def folder_name(kind, name, error=ValueError):
    """NAME, which becomes a folder under the output folders (a pair, a run): one path component of
    plain characters, so that it cannot point elsewhere; else ERROR naming KIND."""
    if not FOLDER_NAME.match(name):
        raise error(f"{kind} {name!r}: a name of letters, digits and _ . + - (no / or leading . or -), "
                    "as it names a folder")
    return name


def lr_tag(lr):
    """A learning rate as a run name writes it: 5e-4, 1.5e-3."""
    mantissa, exponent = f"{lr:e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def run_name(system, seed=None, schedule=None, lr=None, multiplier=1.0):
    """The name of a run of SYSTEM (see the module docstring)."""
    name = system + (f"_{schedule}" if schedule else "")
    if lr is not None:
        name += f"_lr{lr_tag(lr)}"
    elif multiplier != 1.0:
        name += f"_lr{multiplier:g}x"
    return name + (f"_seed{seed}" if seed not in (None, 1) else "")


def split_seed(name):
    """(the run's name without _seedK, K) of a run NAME; K = 1 when it has no _seedK."""
    m = SEED.match(name)
    return (m["variant"], int(m["seed"])) if m else (name, 1)
