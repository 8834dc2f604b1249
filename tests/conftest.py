import math
import os
import random
import shutil
import subprocess
import sys

import pytest

# Tiny models: one thread each is fastest, and avoids oversubscribing the 2-core CI machine.
os.environ.setdefault("OMP_NUM_THREADS", "1")
import torch  # noqa: E402

torch.set_num_threads(1)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The tiers (run one with `bash scripts/run_tests.sh -m unit|integration|system`):
#   unit         one module against an independent computation; no training or decoding
#   integration  real fairseq runs on the tiny corpus, our scripts on data, the commands as a
#                user runs them (test_user_interface.py), several processes (seconds each)
#   system       a user's pipeline end to end (minutes each)
# A test's tier is its own marker (or its module's `pytestmark`) if it has one, else integration if
# it uses the tiny corpus (the tiny_data fixture, directly or through another fixture), else unit.
# The default run leaves out system.
TIERS = ("unit", "integration", "system")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if not any(item.get_closest_marker(t) for t in TIERS):
            item.add_marker("integration" if "tiny_data" in item.fixturenames else "unit")


USER_DIR = os.path.join(REPO, "qknorm_fairseq")
SHARED_DATA = os.path.join(os.path.dirname(REPO), "shared", "data")
BIN = os.path.dirname(sys.executable)


def env(**extra):
    """The environment of a command run as a user runs it, with this checkout's package."""
    return dict(os.environ, PYTHONPATH=REPO, **extra)


def run(cmd, cwd=None, env=None, check=True):
    """Run a command (list); on failure show its output in the assertion message."""
    full_env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    full_env.pop("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", None)  # the plugin must not need it
    proc = subprocess.run(cmd, cwd=cwd, env=full_env, capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-6000:]}")
    return proc


def fairseq(tool, *args, **kw):
    return run([os.path.join(BIN, f"fairseq-{tool}"), *map(str, args)], **kw)


def write_reverse_corpus(folder, n_train=400, n_valid=40, seed=1):
    """A tiny learnable task: the target is the source reversed, with each word renamed."""
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(24)]
    os.makedirs(folder, exist_ok=True)
    for split, n in (("train", n_train), ("valid", n_valid), ("test", n_valid)):
        with open(f"{folder}/{split}.src", "w") as fs, open(f"{folder}/{split}.tgt", "w") as ft:
            for _ in range(n):
                sent = [rng.choice(words) for _ in range(rng.randint(3, 8))]
                fs.write(" ".join(sent) + "\n")
                ft.write(" ".join("v" + w[1:] for w in reversed(sent)) + "\n")


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory):
    """The tiny corpus of every test: raw text (raw/{train,valid,test}.{src,tgt}) and a
    joined-dictionary data-bin (bin/) of the reverse task. Read-only: copy it to change it."""
    root = tmp_path_factory.mktemp("tiny")
    write_reverse_corpus(root / "raw")
    fairseq("preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", root / "raw/train",
            "--validpref", root / "raw/valid", "--testpref", root / "raw/test", "--destdir", root / "bin",
            "--joined-dictionary", "--workers", "1")
    return root


# the model of qknorm_fairseq's presets (train_args) ...
TINY_MODEL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
# ... and fairseq's own transformer, smaller still, through the fairseq-train command (train_cmd)
TINY_STOCK = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]


def train_args(data_bin, save_dir, arch, *extra, max_epoch=2):
    return [data_bin, "--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL, "--optimizer", "adam",
            "--lr", "0.005", "--max-tokens", "2000", "--max-epoch", str(max_epoch), "--save-dir", save_dir,
            "--criterion", "masked_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
            "--share-all-embeddings", "--no-progress-bar", "--log-interval", "1", "--seed", "1",
            "--num-workers", "0", "--no-epoch-checkpoints", *extra]


def train_cmd(data_bin, save_dir, *extra):
    return [os.path.join(BIN, "fairseq-train"), *map(str, [
        data_bin, "--user-dir", USER_DIR, "--task", "translation_qk", *TINY_STOCK, "--optimizer", "adam",
        "--max-tokens", "512", "--save-dir", save_dir, "--no-progress-bar", "--log-format", "json",
        "--log-interval", "1", "--seed", "1", "--num-workers", "0", "--no-epoch-checkpoints", *extra])]


def pipeline_env(root):
    """The folders of the pipeline's scripts (DATA_DIR, DATA_BIN, ...), all under `root`."""
    return env(DATA_DIR=os.path.join(root, "data"), DATA_BIN=os.path.join(root, "data-bin"),
               CKPT_DIR=os.path.join(root, "checkpoints"), LOG_DIR=os.path.join(root, "logs"),
               RESULTS_DIR=os.path.join(root, "results"), VENV=os.path.dirname(BIN))


@pytest.fixture(scope="session")
def tiny_pipeline(tiny_data, tmp_path_factory):
    """The tiny corpus as pair 'demo' of the pipeline (pipeline_env), with two systems trained for
    2 epochs: 'postnorm' and 'prenorm' (fairseq's tiny transformer, post- and pre-norm)."""
    root = tmp_path_factory.mktemp("pipeline")
    shutil.copytree(tiny_data / "bin", root / "data-bin" / "demo")
    (root / "data" / "demo" / "tok").mkdir(parents=True)
    shutil.copy(tiny_data / "raw" / "test.tgt", root / "data" / "demo" / "tok" / "test.tgt")
    for system, extra in (("postnorm", []), ("prenorm", ["--encoder-normalize-before", "--decoder-normalize-before"])):
        (root / "logs" / "demo" / system).mkdir(parents=True)
        run(train_cmd(root / "data-bin" / "demo", root / "checkpoints" / "demo" / system, "--lr", "5e-3",
                      "--max-epoch", "2", "--log-file", root / "logs" / "demo" / system / "train.log",
                      "--eval-bleu", "--eval-bleu-args", '{"beam": 1}', "--best-checkpoint-metric", "bleu",
                      "--maximize-best-checkpoint-metric", "--clip-norm", "1.0", "--cpu", *extra))
    return root


def fairseq_inprocess(tool, *args):
    """Run fairseq_cli.<tool>.cli_main in this process (the code behind the fairseq-<tool> command,
    without paying its start-up time again); returns everything it logged."""
    import importlib
    import io
    import logging
    from unittest import mock

    from fairseq import checkpoint_utils

    module = importlib.import_module(f"fairseq_cli.{tool}")
    # fairseq keeps the best validation score of a run on a function attribute: forget it
    checkpoint_utils.save_checkpoint.__dict__.pop("best", None)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s | %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    level, root.level = root.level, logging.INFO
    try:
        with mock.patch.object(sys, "argv", [f"fairseq-{tool}", *map(str, args)]):
            module.cli_main()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return buffer.getvalue()


def sentence_stats(hyp, ref):
    """Textbook BLEU statistics of one sentence: matches and totals for n = 1..4, lengths."""
    h, r = hyp.split(), ref.split()
    stats = []
    for n in range(1, 5):
        hg = [tuple(h[i:i + n]) for i in range(len(h) - n + 1)]
        rg = [tuple(r[i:i + n]) for i in range(len(r) - n + 1)]
        stats += [sum(min(hg.count(g), rg.count(g)) for g in set(hg)), len(hg)]
    return stats + [len(h), len(r)]


def bleu_from_stats(stats):
    """Corpus BLEU-4 from summed sentence_stats (single reference, no smoothing)."""
    c, t, hl, rl = stats[0:8:2], stats[1:8:2], stats[8], stats[9]
    if 0 in c:
        return 0.0
    bp = 1.0 if hl >= rl else math.exp(1 - rl / hl)
    return 100 * bp * math.exp(sum(math.log(a / b) for a, b in zip(c, t)) / 4)


def naive_bleu(hyps, refs):
    """Independent textbook corpus BLEU-4 (single reference, no smoothing)."""
    return bleu_from_stats([sum(col) for col in zip(*(sentence_stats(h, r) for h, r in zip(hyps, refs)))])


def brute_force_bootstrap_p(refs, base, system, n_samples=300, seed=7):
    """Koehn's one-sided paired bootstrap computed the slow way: resample sentences, score both
    systems with naive BLEU, count the resamples where `system` does not beat `base`."""
    sb = [sentence_stats(h, r) for h, r in zip(base, refs)]
    ss = [sentence_stats(h, r) for h, r in zip(system, refs)]
    rng = random.Random(seed)
    not_better = 0
    for _ in range(n_samples):
        idx = [rng.randrange(len(refs)) for _ in refs]
        score = [bleu_from_stats([sum(col) for col in zip(*(st[i] for i in idx))]) for st in (ss, sb)]
        not_better += score[0] <= score[1]
    return (not_better + 1) / (n_samples + 1)
