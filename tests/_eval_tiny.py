"""A real tiny trained fairseq model for the evaluation/plot tests (built once per session)."""
import os
import random
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.dirname(sys.executable)
_CACHE = {}


def env():
    e = dict(os.environ, PYTHONPATH=REPO)
    return e


def build():
    """Dirs laid out as the pipeline contract: DATA_DIR, DATA_BIN, CKPT_DIR, LOG_DIR for pair 'demo',
    systems 'postnorm' and 'prenorm' (stock tiny transformer, post- vs pre-norm)."""
    if "root" in _CACHE:
        return _CACHE["root"]
    root = tempfile.mkdtemp(prefix="qk_eval_")
    raw = os.path.join(root, "raw")
    os.makedirs(raw)
    os.makedirs(os.path.join(root, "data", "demo", "tok"))
    rng = random.Random(0)
    words = [f"w{i}" for i in range(30)]
    for split, n in [("train", 600), ("valid", 40), ("test", 30)]:
        with open(os.path.join(raw, f"{split}.src"), "w") as fs, open(os.path.join(raw, f"{split}.tgt"), "w") as ft:
            for _ in range(n):
                s = [rng.choice(words) for _ in range(rng.randint(3, 7))]
                fs.write(" ".join(s) + "\n")
                ft.write(" ".join(w.upper() for w in s) + "\n")
    with open(os.path.join(raw, "test.tgt")) as f, open(os.path.join(root, "data", "demo", "tok", "test.tgt"), "w") as g:
        g.write(f.read())
    p = lambda s: os.path.join(raw, s)  # noqa: E731
    subprocess.run([os.path.join(BIN, "fairseq-preprocess"), "--source-lang", "src", "--target-lang", "tgt",
                    "--trainpref", p("train"), "--validpref", p("valid"), "--testpref", p("test"),
                    "--destdir", os.path.join(root, "data-bin", "demo"), "--joined-dictionary", "--workers", "1"],
                   check=True, capture_output=True, env=env())
    for system, extra in [("postnorm", []), ("prenorm", ["--encoder-normalize-before", "--decoder-normalize-before"])]:
        log_dir = os.path.join(root, "logs", "demo", system)
        os.makedirs(log_dir)
        subprocess.run(
            [os.path.join(BIN, "fairseq-train"), os.path.join(root, "data-bin", "demo"),
             "--user-dir", os.path.join(REPO, "qknorm_fairseq"), "--arch", "transformer",
             "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
             "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
             "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--optimizer", "adam",
             "--lr", "5e-3", "--max-tokens", "1000", "--max-epoch", "2", "--log-format", "json",
             "--log-interval", "2", "--log-file", os.path.join(log_dir, "train.log"),
             "--save-dir", os.path.join(root, "checkpoints", "demo", system), "--eval-bleu",
             "--eval-bleu-args", '{"beam": 1}', "--best-checkpoint-metric", "bleu",
             "--maximize-best-checkpoint-metric", "--no-epoch-checkpoints", "--clip-norm", "1.0",
             "--cpu", "--num-workers", "0", "--seed", "1", *extra],
            check=True, capture_output=True, env=env())
    _CACHE["root"] = root
    return root


def pipeline_env(root):
    e = env()
    e.update(DATA_DIR=os.path.join(root, "data"), DATA_BIN=os.path.join(root, "data-bin"),
             CKPT_DIR=os.path.join(root, "checkpoints"), LOG_DIR=os.path.join(root, "logs"),
             RESULTS_DIR=os.path.join(root, "results"), VENV=os.path.dirname(BIN))
    return e
