"""A tiny synthetic parallel corpus and helpers to run the real fairseq commands on it."""
import atexit
import os
import random
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.environ.get("QKNORM_TEST_USER_DIR", os.path.join(REPO, "qknorm_fairseq"))
BIN = os.path.dirname(sys.executable)

# Stock fairseq transformer, tiny enough for a few seconds per run on 2 CPU cores.
TINY_MODEL = (
    "--arch transformer --encoder-layers 1 --decoder-layers 1 --encoder-embed-dim 32 --decoder-embed-dim 32 "
    "--encoder-ffn-embed-dim 64 --decoder-ffn-embed-dim 64 --encoder-attention-heads 2 "
    "--decoder-attention-heads 2 --share-all-embeddings"
).split()


def env():
    e = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return e


def run(cmd, **kw):
    """Runs a command; on failure the assertion shows its output."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), **kw)
    assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-5000:]}"
    return p


def run_fail(cmd, **kw):
    """Runs a command that must fail; returns the finished process."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env(), **kw)
    assert p.returncode != 0, f"{' '.join(cmd)} should have failed:\n{p.stdout[-3000:]}"
    return p


def make_corpus(root, n_train=400, n_valid=40, seed=1):
    """src: random words; tgt: the same words upper-cased and reversed. Binarized with a joint dictionary."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    raw = os.path.join(root, "raw")
    os.makedirs(raw, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        with open(os.path.join(raw, f"{split}.src"), "w") as fs, open(os.path.join(raw, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s = [rng.choice(words) for _ in range(rng.randint(2, 7))]
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(w.upper() for w in reversed(s)) + "\n")
    data_bin = os.path.join(root, "bin")
    run([os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
         "--destdir", data_bin, "--joined-dictionary", "--workers", "1"])
    return data_bin


def train_cmd(data_bin, save_dir, *extra):
    return [
        os.path.join(BIN, "fairseq-train"), data_bin, "--user-dir", USER_DIR, "--task", "translation_qk",
        *TINY_MODEL, "--optimizer", "adam", "--max-tokens", "512", "--save-dir", save_dir,
        "--no-progress-bar", "--log-format", "json", "--log-interval", "1", "--seed", "1",
        "--num-workers", "0", "--no-epoch-checkpoints", *extra,
    ]


_SHARED = {}


def shared_corpus():
    """One binarized tiny corpus per test process (read-only: copy it before changing anything)."""
    if "bin" not in _SHARED:
        root = tempfile.mkdtemp(prefix="qk_tiny_corpus_")
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        _SHARED["bin"] = make_corpus(root)
    return _SHARED["bin"]
