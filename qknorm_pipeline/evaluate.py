"""Decodes the test set with a trained run's checkpoint and scores it.

usage: bash scripts/evaluate.sh [--verbose] [--checkpoint best|last] PAIR SYSTEM [extra fairseq-generate flags...]
       (python -m qknorm_pipeline.evaluate takes the same arguments)

  PAIR     a configs/PAIR.yaml (gl-en sk-en en-vi en-he ar-en demo), or your own pair
           prepared with scripts/prepare.sh --src-dir
  SYSTEM   a trained run: $CKPT_DIR/PAIR/SYSTEM/checkpoint_best.pt (scripts/train.sh PAIR SYSTEM)
Extra flags go to fairseq-generate and win over the recipe, e.g. --beam 8, or --decode-precision
bf16 (decoding under CUDA autocast on a GPU, or on a CPU with native bf16); a precision the machine
cannot decode in is refused in one line before the model loads.

Decodes $DATA_BIN/PAIR (test split) with the pair's decoding recipe (beam 4, max length = source
length + 50, BPE or SentencePiece undone as $DATA_BIN/PAIR/stats.json says, the papers' length
normalisation and beam search; on a CPU under the training's memory allocator, QKNORM_MALLOC:
docs/performance.md), restores the original sentence order and scores against
$DATA_DIR/PAIR/tok/test.<tgt> with the pair's eval.metric / eval.detok (configs/PAIR.yaml). Prints
one line when decoding starts, the progress (sentences done / total), and the score. Writes
$RESULTS_DIR/PAIR/SYSTEM/{generate.out,generate.log,hyp.txt,scores.json} (--checkpoint last: in
its last/ subfolder). A stored result is reused only when the checkpoint, the test data, the whole
decoding command, the scorer and the package versions are unchanged (a fingerprint in the
folder's .done, written last, see qknorm_pipeline/fingerprint.py); anything else decodes again,
into NAME.new files that replace the stored result only once the new one is scored, so a failed
attempt (a mistyped flag) leaves the previous result whole and finished (generate.log: the latest
attempt's).
scores.json names the checkpoint and its SHA-256, by which compare.sh refuses scores of a
checkpoint trained again since.
A checkpoint cut short (no zip directory at its end) is refused before decoding, with what to do.
Exit status: 0 scored, 2 a usage error, 1 a failure.
"""
import argparse
import glob
import os
import sys

from . import allocator, processes, recipes
from .cli import Parser, UsageError, UserError, log, prog
from .cli import main as run_main
from .files import count_lines, is_whole_checkpoint, read_json, write_lines
from .fingerprint import fingerprint_of, parts
from .hardware import has_gpu
from .names import split_seed
from .paths import folders, shareable, short
from .scoring.score import score_systems, write_scores
from .train import data_digest, trained_on_other_data

TAG = "evaluate"


def out_dir(where, pair, run, checkpoint="best"):
    base = os.path.join(where.results, pair, run)
    return base if checkpoint == "best" else os.path.join(base, checkpoint)


def score_line(scores):
    metric = scores["metric"]
    return ", ".join(f"{metric} {s[metric]:.2f}" for s in scores["systems"].values())


def hypotheses(generate_out):
    """fairseq-generate prints hypotheses by length bucket (H-<id>\\tscore\\ttext): corpus order, each sentence's
    first (with --nbest N, its best of N)."""
    hyps = {}
    with open(generate_out, encoding="utf-8") as f:
        for line in f:
            if line.startswith("H-"):
                sid, _score, text = line.rstrip("\n").split("\t", 2)
                hyps.setdefault(int(sid[2:]), text)
    return [hyps[i] for i in sorted(hyps)]


def train_command(cfg, pair, run):
    """The train.sh command that makes RUN: a system of the pair, or one with --seed K (SYSTEM_seedK);
    other names (a schedule, a study's rate) come from a command this cannot rebuild."""
    system, seed = split_seed(run)
    if system not in cfg.systems:
        return f"the train.sh command that named it {run}"
    return f"bash scripts/train.sh {f'--seed {seed} ' if seed != 1 else ''}{pair} {system}"


def decoding_env(cfg, gen):
    """(environment, words for the log) of fairseq-generate GEN: on a CPU, with the recipe's cpu:
    settings and the training's memory allocator (allocator.py), which the log names; where none is
    found, a warning says how to install one."""
    env = recipes.cpu_env(cfg)
    if "--cpu" not in gen and has_gpu():
        return env, ""
    try:
        env, name = allocator.for_child(env)
    except ValueError as e:
        raise UserError(str(e)) from None
    if name == "system" and env.get(allocator.VAR) != "system":
        log(TAG, f"warning: decoding with {allocator.label(name)}: {allocator.MISSING}: {allocator.INSTALL}")
    return env, f" ({allocator.label(name)})"


def evaluate(pair, run, extra=(), checkpoint="best", where=None):
    """Decode and score RUN's checkpoint (best or last); returns its scores (scores.json)."""
    where = where or folders()
    cfg = recipes.load(pair, os.path.join(where.data_bin, pair))
    ckpt = os.path.join(where.ckpt, pair, run, f"checkpoint_{checkpoint}.pt")
    data_bin = os.path.join(where.data_bin, pair)
    ref = os.path.join(where.data, pair, "tok", f"test.{cfg.tgt}")
    out = out_dir(where, pair, run, checkpoint)
    if not os.path.isfile(ckpt):
        if not os.path.isdir(os.path.dirname(ckpt)) and split_seed(run)[0] not in cfg.systems:
            raise UsageError(f"unknown system {run!r}: no {short(os.path.dirname(ckpt))}/ and not one of the systems "
                             f"of configs/{pair}.yaml ({' '.join(cfg.systems)})")
        raise UserError(f"no checkpoint {short(ckpt)}: train first ({train_command(cfg, pair, run)})")
    if not is_whole_checkpoint(ckpt):
        other = "last" if checkpoint == "best" else "best"
        raise UserError(f"{short(ckpt)} is not a whole checkpoint (cut short?): decode checkpoint_{other}.pt "
                        f"(--checkpoint {other}), or move {short(os.path.dirname(ckpt))}/ away and train again "
                        f"({train_command(cfg, pair, run)})")
    if not os.path.isdir(data_bin):
        raise UserError(f"no binarized data {short(data_bin)}: run bash scripts/prepare.sh --pair {pair}")
    if trained_on_other_data(os.path.dirname(ckpt), data_digest(data_bin)):
        raise UserError(f"{pair}/{run}: the data in {short(data_bin)} has changed since {short(ckpt)} was trained "
                        f"(prepared again?): its test set would be decoded with another vocabulary; prepare the data "
                        f"it was trained on again, or move {short(os.path.dirname(ckpt))}/ away and train it again "
                        f"({train_command(cfg, pair, run)})")
    if not os.path.isfile(ref):
        raise UserError(f"no tokenized reference {short(ref)}: run bash scripts/prepare.sh --pair {pair}")

    # --required-batch-size-multiple 1: with fairseq's default of 8, fairseq-generate (fairseq-fixed
    # 0.12.3.1) silently drops the sentences of an incomplete last batch (24 of 30 decoded).
    gen = ["fairseq-generate", data_bin, "--path", ckpt, "--gen-subset", "test", "--max-tokens", "8000",
           "--required-batch-size-multiple", "1", *recipes.generate_args(cfg, data_bin), *extra]
    metric, detok, lang = cfg.eval.metric, cfg.eval.detok, cfg.tgt
    scorer = ["score", "--metric", metric, "--detok", detok, "--lang", lang]
    data_files = sorted(glob.glob(os.path.join(data_bin, "dict.*.txt")) + glob.glob(os.path.join(data_bin, "test.*")))
    identity = parts([ckpt, ref, *data_files], gen + scorer)
    key = fingerprint_of(identity)
    scores_path = os.path.join(out, "scores.json")
    if os.path.isfile(scores_path) and processes.is_done(out, key):
        try:
            scores = read_json(scores_path, "it is decoded and scored again")
        except UserError as e:
            log(TAG, str(e))
        else:
            log(TAG, f"{pair}/{run} already evaluated with this checkpoint and decoding command: {score_line(scores)} "
                     f"({short(scores_path)})")
            return scores
    # the attempt's outputs are NAME.new until it succeeds: a failed one (a mistyped flag) leaves the
    # previous result whole and finished; generate.log is the latest attempt's
    new = {name: os.path.join(out, name + ".new") for name in ("generate.out", "hyp.txt", "scores.json")}
    os.makedirs(out, exist_ok=True)
    n_ref = count_lines(ref)
    generate_log = os.path.join(out, "generate.log")
    env, malloc = decoding_env(cfg, gen)
    log(TAG, f"decoding {pair}/{run}: {n_ref} test sentences with {short(ckpt)}{malloc}; log {short(generate_log)}")
    processes.decode(f"{pair}/{run}", gen, new["generate.out"], generate_log, n_ref, env=env)
    hyps = hypotheses(new["generate.out"])
    write_lines(new["hyp.txt"], hyps)
    if len(hyps) != n_ref:
        raise UserError(f"{short(new['hyp.txt'])} has {len(hyps)} lines but {short(ref)} has {n_ref}: fairseq-generate "
                        f"skipped sentences (see {short(new['generate.out'])})")
    scores = score_systems([ref], [(run, new["hyp.txt"])], detok=detok, lang=lang, metric=metric,
                           warn=lambda m: print(f"warning: {m}", file=sys.stderr))
    # compare checks that both are current
    scores["checkpoint"] = {"path": shareable(ckpt), "sha256": identity["files"][0]}
    scores["reference_sha256"] = identity["files"][1]
    # fairseq-generate's flags after --path: compare refuses systems decoded otherwise than the rest
    scores["decoding"] = [shareable(w) if os.path.isabs(w) else w for w in gen[4:]]
    write_scores(new["scores.json"], scores)
    if os.path.exists(os.path.join(out, ".done")):
        os.remove(os.path.join(out, ".done"))  # from here until mark_done the folder is unfinished, never mixed
    for name, path in new.items():
        os.replace(path, os.path.join(out, name))
    processes.mark_done(out, key)
    log(TAG, f"{pair}/{run}: test {score_line(scores)} (detok {detok}) -> {short(scores_path)}")
    return scores


def parser():
    p = Parser(prog=prog("qknorm_pipeline.evaluate"), tag=TAG, description=__doc__,
               usage="%(prog)s [--verbose] [--checkpoint best|last] PAIR SYSTEM [extra fairseq-generate flags...]",
               unknown_hint=" before PAIR SYSTEM; fairseq-generate flags go after PAIR SYSTEM")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="decode checkpoint_best.pt (by dev BLEU, the default) or checkpoint_last.pt")
    p.add_argument("--verbose", action="store_true", help="show fairseq-generate's whole output (= VERBOSE=1)")
    p.add_argument("words", nargs=argparse.REMAINDER, help="PAIR SYSTEM [extra fairseq-generate flags...]")
    return p


def run(a):
    if a.words[:1] == ["--"]:
        a.words = a.words[1:]
    if len(a.words) < 2 or a.words[0].startswith("-"):
        raise UsageError("need PAIR and SYSTEM")
    if a.verbose:
        os.environ["VERBOSE"] = "1"
    evaluate(a.words[0], a.words[1], a.words[2:], a.checkpoint)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
