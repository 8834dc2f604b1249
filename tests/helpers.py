"""What the tests share: the repository's places, commands run as a user runs them, the tiny
corpus and model, independent (textbook) BLEU and bootstrap, evaluated results and fairseq log lines."""
import contextlib
import json
import math
import os
import random
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(REPO, "qknorm_fairseq")
# The real corpora a few tests read (ted-gl-en, ted-az-en, iwslt15-en-vi; data/README.md): the folder that
# QKNORM_TEST_DATA names, else ../shared/data beside the checkout. tests/README.md says more.
TEST_DATA_VARIABLE = "QKNORM_TEST_DATA"
SHARED_DATA = os.path.abspath(os.environ.get(TEST_DATA_VARIABLE) or os.path.join(os.path.dirname(REPO), "shared", "data"))
BIN = os.path.dirname(sys.executable)


@contextlib.contextmanager
def torch_threads(n):
    """torch's thread count N within it (the C kernels take theirs from it), the count before restored after."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def on_threads(n, fn, *args):
    """FN(*ARGS) on N of torch's threads."""
    with torch_threads(n):
        return fn(*args)


# --- commands as a user runs them ---------------------------------------------------------------

def environment(root=None, **extra):
    """The environment of a command run as a user runs it: this Python's environment as the project's
    (QKNORM_USE_ENV=1, no .venv is built), this checkout's code, and with ROOT every output folder
    (DATA_DIR, DATA_BIN, CKPT_DIR, LOG_DIR, RESULTS_DIR) under ROOT."""
    e = dict(os.environ, QKNORM_USE_ENV="1", PYTHONPATH=REPO, PYTHONWARNINGS="ignore",
             PATH=BIN + os.pathsep + os.environ["PATH"])
    for key in ("VERBOSE", "QKNORM_DOOR", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"):  # the plugin must not need the last
        e.pop(key, None)
    if root is not None:
        root = str(root)
        e.update(DATA_DIR=os.path.join(root, "data"), DATA_BIN=os.path.join(root, "data-bin"),
                 CKPT_DIR=os.path.join(root, "checkpoints"), LOG_DIR=os.path.join(root, "logs"),
                 RESULTS_DIR=os.path.join(root, "results"))
    e.update({k: str(v) for k, v in extra.items()})
    return e


def run(cmd, cwd=None, env=None, check=True, stderr=subprocess.PIPE):
    """Run CMD (a list) as a user would; on failure its output is in the assertion message."""
    proc = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env or environment(), stdout=subprocess.PIPE,
                          stderr=stderr, text=True)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{(proc.stderr or '')[-6000:]}")
    return proc


def script(name, *args, root=None, check=False, **extra_env):
    """bash scripts/NAME ARGS..., outputs under ROOT when given."""
    return run(["bash", os.path.join(REPO, "scripts", name), *args], env=environment(root, **extra_env), check=check)


def module(name, *args, root=None, check=False, **extra_env):
    """python -m qknorm_pipeline.NAME ARGS..."""
    return run([sys.executable, "-m", f"qknorm_pipeline.{name}", *args], cwd=REPO,
               env=environment(root, **extra_env), check=check)


def fairseq(tool, *args, **kw):
    return run([os.path.join(BIN, f"fairseq-{tool}"), *args], **kw)


def fairseq_inprocess(tool, *args):
    """Run fairseq_cli.<tool>.cli_main in this process (the code behind the fairseq-<tool> command,
    without paying its start-up time again); returns everything it logged."""
    import importlib
    import io
    import logging
    from unittest import mock

    from fairseq import checkpoint_utils

    mod = importlib.import_module(f"fairseq_cli.{tool}")
    # fairseq keeps the best validation score of a run, and --patience's count, on function attributes: forget them
    checkpoint_utils.save_checkpoint.__dict__.pop("best", None)
    if tool == "train":
        for name in ("best", "num_runs"):
            mod.should_stop_early.__dict__.pop(name, None)
    buffer = io.StringIO()
    handler = logging.StreamHandler(buffer)
    handler.setFormatter(logging.Formatter("%(name)s | %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    level, root.level = root.level, logging.INFO
    try:
        with mock.patch.object(sys, "argv", [f"fairseq-{tool}", *map(str, args)]):
            mod.cli_main()
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return buffer.getvalue()


def shared(name):
    """The real corpus file or folder NAME under SHARED_DATA, or the test is skipped naming what is missing."""
    path = os.path.join(SHARED_DATA, name)
    if not os.path.exists(path):
        pytest.skip(f"real corpus absent: {path} (set {TEST_DATA_VARIABLE} to the folder that holds {name})")
    return path


# --- the tiny corpus and models ------------------------------------------------------------------

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


# the model of qknorm_fairseq's presets (train_args) ...
TINY_MODEL = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
# ... and fairseq's own transformer, smaller still, through the fairseq-train command (train_cmd)
TINY_STOCK = ["--arch", "transformer", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim", "32",
              "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64",
              "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--share-all-embeddings"]
# fairseq flags after PAIR SYSTEM win over a recipe: a tiny model and a few updates
TINY_RECIPE = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
               "--decoder-ffn-embed-dim", "64", "--encoder-layers", "1", "--decoder-layers", "1",
               "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-tokens", "1000",
               "--lr", "0.005", "--warmup-updates", "10", "--num-workers", "0", "--log-interval", "5",
               "--eval-bleu-args", '{"beam": 2, "max_len_a": 1, "max_len_b": 5}']


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


def build(data_bin, arch, *extra):
    """A preset built from fairseq's parsed arguments, as fairseq-train builds it (seed 0)."""
    import torch
    from fairseq import options, tasks

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_bin), "--user-dir", USER_DIR, "--arch", arch, *TINY_MODEL,
                                                "--share-all-embeddings", "--criterion",
                                                "masked_label_smoothed_cross_entropy", *extra])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task.build_model(args), task


# a training batch's forward without dropout: the packed and padded paths compute the same loss
NO_DROPOUT = ["--task", "translation_qk", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
              "--word-dropout", "0"]


def train_sample(task, n=11):
    """The first N sentence pairs of TASK's train split as one batch."""
    task.load_dataset("train")
    ds = task.dataset("train")
    return ds.collater([ds[i] for i in range(n)])


class Backward:
    """The optimizer task.train_step calls: the loss's backward only."""

    def backward(self, loss):
        loss.backward()


def batch(task, bsz=3, src_len=7, tgt_len=6, seed=0):
    """(source tokens, lengths, decoder input) of random sentences, one source left-padded."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = task.source_dictionary
    src = torch.randint(d.nspecial, len(d), (bsz, src_len), generator=g)
    src[:, -1] = d.eos()
    src[1, :2] = d.pad()  # fairseq pads sources on the left
    lengths = (src != d.pad()).sum(1)
    prev = torch.randint(d.nspecial, len(d), (bsz, tgt_len), generator=g)
    prev[:, 0] = d.eos()
    return src, lengths, prev


# --- textbook BLEU and bootstrap (independent of qknorm_pipeline/scoring) -------------------------

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


# --- results as evaluate.sh leaves them ---------------------------------------------------------

def write_result(folder, hyps, scores):
    """FOLDER as evaluate.sh leaves a finished run: hyp.txt (HYPS, one per line), scores.json (SCORES)
    and, written last, .done."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (folder / "scores.json").write_text(json.dumps(scores), encoding="utf-8")
    (folder / ".done").write_text("fixture\n")


# --- fairseq's log lines -------------------------------------------------------------------------

def log_line(kind, record, stamp="12:00:00", day="2026-01-01"):
    """One line of fairseq's --log-format json output: `DATE TIME | INFO | KIND | {...}`."""
    return f"{day} {stamp} | INFO | {kind} | {json.dumps({k: str(v) for k, v in record.items()})}\n"


def write_train_log(path, lines, command="python -m qknorm_pipeline.fairseq_train data-bin"):
    """A train.log as the train step writes it: a `# DATE COMMAND` line, then fairseq's lines."""
    os.makedirs(os.path.dirname(str(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(f"# 2026-01-01T12:00:00Z {command}\n" + "".join(lines))
    return path
