"""The gl->en study (qknorm_pipeline/study/): its runs and their flags, wall time and dev-BLEU curves
from fairseq logs across resumptions, record comparison, and the report on fixture records
(tests/system runs scripts/study.sh)."""
import dataclasses
import json
import os
import random
import re
import statistics

import numpy as np
import pytest
import yaml
from scipy import stats as scipy_stats

from qknorm_pipeline import hardware, recipes
from qknorm_pipeline import train as train_step
from qknorm_pipeline.paths import Folders
from qknorm_pipeline.scoring import bleu as bleu_module
from qknorm_pipeline.scoring.significance import holm, seed_t_test, sentence_variance
from qknorm_pipeline.study import config, records, render, report
from qknorm_pipeline.study import runs as study_runs
from qknorm_pipeline.study import stats as study_stats
from qknorm_pipeline.study.config import StudyError

from helpers import REPO, log_line, naive_bleu

CONFIG = os.path.join(REPO, "configs", "studies", "gl-en.yaml")
NORM = os.path.join(REPO, "configs", "studies", "gl-en-norm.yaml")  # one recipe, an LR grid


def _line(stamp, kind, record):
    return log_line(kind, record, stamp)


# A run started at 12:00, killed at 12:03:10 just after validating update 40 (before its checkpoint
# was written), resumed at 13:00 from update 20, finished at 13:02:20; a third start crashed before
# fairseq wrote anything. fairseq's own "wall" restarts in the second segment.
RESUMED = (
    "# 2026-01-01T12:00:00Z python -m qknorm_pipeline.fairseq_train data-bin --user-dir x\n"
    "2026-01-01 12:00:05 | INFO | fairseq_cli.train | task: TranslationQKTask\n"
    + _line("12:01:05", "train_inner", {"num_updates": 10, "loss": 9.0, "wall": 60})
    + _line("12:02:05", "valid", {"valid_loss": 8.0, "valid_bleu": 1.5, "valid_num_updates": 20, "wall": 120})
    + _line("12:03:05", "valid", {"valid_loss": 7.0, "valid_bleu": 2.0, "valid_num_updates": 40, "wall": 180})
    + "2026-01-01 12:03:10 | INFO | fairseq.checkpoint_utils | Preparing to save checkpoint for update 40\n"
    "# 2026-01-01T13:00:00Z python -m qknorm_pipeline.fairseq_train data-bin --user-dir x\n"
    "2026-01-01 13:00:10 | INFO | qknorm_pipeline.fairseq_train | machine: Some CPU, 2 CPUs; torch 2.13\n"
    "2026-01-01 13:00:10 | INFO | fairseq.trainer | Loaded checkpoint checkpoint_last.pt (epoch 1 @ 20 updates)\n"
    + _line("13:01:10", "valid", {"valid_loss": 6.5, "valid_bleu": 2.5, "valid_num_updates": 40, "wall": 0})
    + _line("13:02:10", "valid", {"valid_loss": 6.0, "valid_bleu": 3.0, "valid_num_updates": 60, "wall": 0})
    + "2026-01-01 13:02:20 | INFO | fairseq_cli.train | done training in 130.0 seconds\n"
    "# 2026-01-01T14:00:00Z python -m qknorm_pipeline.fairseq_train data-bin --user-dir x\n"
)


def test_wall_time_is_summed_over_resumptions(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(RESUMED)
    run = records.read_run(str(log))
    # segment 1: 12:00:05 -> 12:03:10 = 185 s; segment 2: 13:00:10 -> 13:02:20 = 130 s; segment 3: none
    assert run["wall_s"] == 315 and run["segments"] == 3 and run["updates"] == 60
    # update 40 was validated twice: the resumed run's validation is kept, at 185 + 60 s
    assert run["curve"] == [{"updates": 20, "wall_s": 120, "bleu": 1.5},
                            {"updates": 40, "wall_s": 245, "bleu": 2.5},
                            {"updates": 60, "wall_s": 305, "bleu": 3.0}]
    assert run["commands"][0] == "python -m qknorm_pipeline.fairseq_train data-bin --user-dir x"
    assert run["machines"] == [None, "Some CPU, 2 CPUs; torch 2.13", None]  # the first start logged none


def test_log_not_written_by_the_scripts_is_refused(tmp_path):
    log = tmp_path / "train.log"
    log.write_text(_line("12:00:00", "valid", {"valid_loss": 1, "valid_bleu": 1, "valid_num_updates": 1}))
    with pytest.raises(StudyError, match="before the first '# DATE COMMAND' line"):
        records.read_run(str(log))
    with pytest.raises(StudyError, match="train the run first"):
        records.read_run(str(tmp_path / "none.log"))


def test_record_change():
    """A finished run's record against the command now: same, a raised budget, or what differs; the
    launcher before the data folder and an older record's study: line are not the run."""
    rec = ("train: python -m qknorm_pipeline.fairseq_train $DATA_BIN/gl-en --max-update 2000 --lr 7e-4\n"
           "decode: --beam 4 --remove-bpe '@@ ' --metric multi_bleu_detok --detok moses\n")
    assert records.record_change(rec, rec + "\n") == "same"
    assert records.record_change("study: scripts/train.sh gl-en qknorm\n" + rec, rec) == "same"
    assert records.record_change(rec, rec.replace("python -m qknorm_pipeline.fairseq_train", "fairseq-train")) == "same"
    assert records.record_change(rec, rec.replace("2000", "3000")) == "more-updates"
    assert records.record_change(rec, rec.replace("2000", "1000")) == "different: train: ... --max-update '2000' now '1000'"
    assert records.record_change(rec, rec.replace("--beam 4", "--beam 5")) == "different: decode: ... --beam '4' now '5'"
    # a budget raised together with another change is no continuation
    assert records.record_change(rec, rec.replace("2000", "3000").replace("7e-4", "1e-3")) \
        == "different: train: ... --lr '7e-4' now '1e-3'"
    assert records.record_change(rec, rec.replace(" --lr 7e-4", "")) == \
        "different: train: 5 words against 3: '--lr 7e-4' left out after '2000'"
    assert records.record_change(rec.splitlines()[0], rec) == \
        "different: the record has train lines, now decode and train"


def test_runs_names_and_order():
    cfg = config.load(CONFIG)
    names = [r.name for r in config.runs(cfg)]
    # seed by seed over every system, then each system at each LR multiplier (seed 1)
    assert names[:6] == ["postnorm", "prenorm", "scalenorm", "qknorm", "fairseq_transformer", "fairseq_prenorm"]
    assert names[6:12] == [f"{s}_seed2" for s in names[:6]] and names[12:14] == ["scalenorm_seed3", "qknorm_seed3"]
    assert names[14:] == [f"{s}_lr2x" for s in names[:6]]
    lr2 = next(r for r in config.runs(cfg) if r.name == "qknorm_lr2x")
    assert (lr2.system, lr2.seed, lr2.lr_multiplier, lr2.stock) == ("qknorm", 1, 2.0, False)
    only = config.runs(cfg, ["qknorm", "fairseq_prenorm"], seeds=1, multipliers=False)
    assert [r.name for r in only] == ["qknorm", "fairseq_prenorm"] and only[1].stock
    with pytest.raises(StudyError, match="--systems: 'dnas' is not in configs/studies/gl-en.yaml"):
        config.runs(cfg, ["dnas"])


def _flags(args):
    return {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")
            and not args[i + 1].startswith("--")}


def test_flags_follow_the_config():
    cfg = config.load(CONFIG)
    rec = config.recipe(cfg)
    b = cfg.budget
    runs = {r.name: r for r in config.runs(cfg)}
    value = _flags(config.train_flags(cfg, runs["qknorm"], rec))
    assert value["--max-update"] == str(b.max_update) and value["--warmup-updates"] == str(b.warmup_updates)
    assert value["--validate-interval-updates"] == value["--save-interval-updates"] == str(b.validate_every)
    # TwT's peak for the study's d with the recipe's own warmup of 8,000 (the gl-en recipe's lambda = 1),
    # reached after the study's short warmup; twice that for the 2x LR run
    assert float(value["--lr"]) == pytest.approx(256 ** -0.5 * 8000 ** -0.5, rel=1e-5)
    assert float(_flags(config.train_flags(cfg, runs["qknorm_lr2x"], rec))["--lr"]) == pytest.approx(
        2 * 256 ** -0.5 * 8000 ** -0.5, rel=1e-5)
    assert json.loads(value["--eval-bleu-args"]) == {"beam": 1, "max_len_a": 1, "max_len_b": 50}
    assert value["--encoder-embed-dim"] == "256" and value["--decoder-layers"] == "3"
    # a smoke budget scales warmup and validation interval with it
    small = _flags(config.train_flags(cfg, runs["qknorm"], rec, max_update=20))
    assert small["--max-update"] == "20" and small["--warmup-updates"] == str(round(20 * b.warmup_updates / b.max_update))
    assert small["--validate-interval-updates"] == str(round(20 * b.validate_every / b.max_update))
    # the study's own warmup does not move with its budget: raising max_update continues the runs
    cfg.budget.max_update = 2 * b.max_update
    longer = _flags(config.train_flags(cfg, runs["qknorm"], rec))
    assert longer["--max-update"] == str(cfg.budget.max_update) and longer["--warmup-updates"] == str(b.warmup_updates)
    with pytest.raises(StudyError, match="not one of the study's systems"):
        config.train_flags(cfg, runs["fairseq_prenorm"], rec)
    # the study's systems: the recipe's presets and stopping rules, without the recipe's flags
    assert rec.systems["qknorm"] == recipes.System(arch="transformer_qknorm", stopping="qknorm")
    args = recipes.train_args(rec, "postnorm")
    assert "--positions" not in args and _flags(args)["--decay-stop-lr"] == "5e-05"


def test_stock_row_is_plain_fairseq_with_its_own_recipe():
    cfg = config.load(CONFIG)
    rec = config.recipe(cfg)
    runs = {r.name: r for r in config.runs(cfg)}
    args = config.stock_args(cfg, runs["fairseq_prenorm_seed2"], rec, "data-bin/gl-en", "ckpt")
    joined = " ".join(args)
    assert "--user-dir" not in args and "translation_qk" not in joined and "--arch transformer " in joined
    value = _flags(args)
    assert value["--adam-betas"] == "(0.9, 0.98)" and value["--lr-scheduler"] == "inverse_sqrt"
    assert float(value["--lr"]) == 5e-4 and value["--dropout"] == "0.3" and float(value["--weight-decay"]) == 1e-4
    assert value["--label-smoothing"] == "0.1" and value["--seed"] == "2"
    assert "--encoder-normalize-before" in args and "--decoder-normalize-before" in args
    assert "--encoder-normalize-before" not in config.stock_args(cfg, runs["fairseq_transformer"], rec, "d", "c")
    assert value["--warmup-updates"] == str(cfg.budget.warmup_updates)
    assert value["--max-update"] == str(cfg.budget.max_update)
    assert value["--eval-bleu-remove-bpe"] == recipes.remove_bpe(rec)
    lr2 = _flags(config.stock_args(cfg, runs["fairseq_transformer_lr2x"], rec, "d", "c"))
    assert float(lr2["--lr"]) == 1e-3


# --- the one-recipe study (configs/studies/gl-en-norm.yaml) ----------------------------------

OURS = ["postnorm", "prenorm", "scalenorm", "qknorm"]
STOCK = ["fairseq_transformer", "fairseq_prenorm"]


def test_norm_study_runs_the_grid_then_seeds_at_each_best_rate():
    cfg = config.load(NORM)
    assert cfg.lr_grid == [5e-4, 1e-3, 2e-3] and not cfg.lr_multipliers
    grid = config.runs(cfg)
    # every system (ours and stock) at each rate, seed 1, rate by rate; nothing else until the grid is recorded
    assert [r.name for r in grid] == [f"{s}_lr{tag}" for tag in ("5e-4", "1e-3", "2e-3") for s in OURS + STOCK]
    assert {(r.seed, r.lr_multiplier) for r in grid} == {(1, 1.0)} and [r.lr for r in grid[::6]] == [5e-4, 1e-3, 2e-3]
    assert [r.system for r in grid if r.stock] == STOCK * 3
    assert config.waiting(cfg) == {s: [2, 3] for s in OURS + STOCK}
    # seeds 2 and 3 at each system's best rate, once it is known; 18 + 12 = 30 runs
    best = dict(zip(OURS + STOCK, [5e-4, 1e-3, 1e-3, 2e-3, 5e-4, 2e-3]))
    everything = config.runs(cfg, best=best)
    assert len(everything) == 30 and config.waiting(cfg, best=best) == {}
    assert [r.name for r in everything[18:24]] == ["postnorm_lr5e-4_seed2", "prenorm_lr1e-3_seed2", "scalenorm_lr1e-3_seed2",
                                                  "qknorm_lr2e-3_seed2", "fairseq_transformer_lr5e-4_seed2",
                                                  "fairseq_prenorm_lr2e-3_seed2"]
    assert [(r.seed, r.lr) for r in everything[24:]] == [(3, best[s]) for s in OURS + STOCK]
    some = config.runs(cfg, ["qknorm"], seeds=2, best={"qknorm": 1e-3})
    assert [r.name for r in some] == ["qknorm_lr5e-4", "qknorm_lr1e-3", "qknorm_lr2e-3", "qknorm_lr1e-3_seed2"]
    assert config.waiting(cfg, ["qknorm", "postnorm"], seeds=1) == {}


def test_the_best_rate_comes_from_the_grid_records(tmp_path):
    cfg = config.load(NORM)
    # qknorm's best dev BLEU: 3.0 at 1e-3; postnorm ties at 5e-4 and 2e-3 (the smaller wins); prenorm unfinished
    runs = {"qknorm_lr5e-4": (600, [1.0, 2.0], 0.3), "qknorm_lr1e-3": (600, [3.0, 2.0], 0.3),
            "qknorm_lr2e-3": (600, [1.0, 1.5], 0.3), "postnorm_lr5e-4": (600, [1.0, 2.5], 0.3),
            "postnorm_lr1e-3": (600, [1.0, 2.0], 0.3), "postnorm_lr2e-3": (600, [2.5, 2.0], 0.3),
            "prenorm_lr5e-4": (600, [1.0, 2.0], 0.3)}
    _, records_dir, _, _ = _records(tmp_path, runs)
    best = records.best_rates(cfg, records_dir)
    assert best == {"qknorm": 1e-3, "postnorm": 5e-4}
    assert config.best_rate({2e-3: 1.0, 1e-3: 1.0, 5e-4: 0.5}) == 1e-3
    named = [r.name for r in config.runs(cfg, best=best) if r.seed > 1]
    assert named == ["postnorm_lr5e-4_seed2", "qknorm_lr1e-3_seed2", "postnorm_lr5e-4_seed3", "qknorm_lr1e-3_seed3"]
    assert list(config.waiting(cfg, best=best)) == ["prenorm", "scalenorm", *STOCK]
    assert "(1 of 3 so far)" in study_runs.waiting_text(cfg, {"prenorm": [2, 3]}, records_dir)


def _last(args):
    """{flag: its last value} (fairseq reads the last one) and the set of bare flags."""
    value = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")
             and not args[i + 1].startswith("--")}
    return value, {a for a in args if a.startswith("--")}


def test_norm_study_trains_every_system_under_one_recipe(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    cfg = config.load(NORM)
    rec = config.recipe(cfg)
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    one = {"--adam-betas": "(0.9, 0.98)", "--clip-norm": "1.0", "--lr-scheduler": "inverse_sqrt", "--warmup-updates": "500",
           "--warmup-init-lr": "0", "--dropout": "0.3", "--attention-dropout": "0.1", "--activation-dropout": "0.1",
           "--criterion": "label_smoothed_cross_entropy", "--label-smoothing": "0.1", "--max-tokens": "4096",
           "--max-update": str(cfg.budget.max_update), "--validate-interval-updates": "200", "--encoder-embed-dim": "256",
           "--encoder-layers": "3", "--decoder-layers": "3"}
    for run in config.runs(cfg):
        planned = study_runs.plan(cfg, run, rec, where)
        value, flags = _last(planned.fairseq_args)
        assert {k: value[k] for k in one} == one, run.name
        assert float(value["--lr"]) == run.lr and float(value["--weight-decay"]) == 0
        assert float(value["--adam-eps"]) == 1e-8
        # bf16 for every row: train.sh --precision bf16 for ours, fairseq's --bf16 for the stock rows
        assert "--bf16" in flags and "--fp16" not in flags, run.name
        if run.stock:
            # fairseq-train cannot run --bf16 without TPUs: started as train.sh starts ours, no plugin
            assert planned.cmd[1:3] == ["-m", "qknorm_pipeline.fairseq_train"] and "--user-dir" not in flags
            assert value["--optimizer"] == "adam"
            assert value["--arch"] == "transformer"
            assert ("--encoder-normalize-before" in flags) == (run.system == "fairseq_prenorm")
        else:
            assert planned.where == "1 GPU(s) (bf16)"
            assert value["--arch"] == f"transformer_{run.system}" and value["--patience"] == "-1"
            # the TwT recipe's other regularisers off; no recipe flag of the pair's systems
            assert float(value["--word-dropout"]) == 0 and "--no-target-vocab-mask" in flags
            assert "--positions" not in flags and "--decay-stop-lr" not in flags


def test_fast_puts_our_rows_on_the_cpus_fast_path(tmp_path, monkeypatch):
    """fast: true gives our rows train.sh --fast (cpu.fast of base.yaml, and cpu.fast_bf16 in bf16); the stock
    rows, which cannot take our flags, train as before; and on a GPU --fast is refused."""
    monkeypatch.setattr(hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: True)
    monkeypatch.setattr(hardware, "cpu_bf16_speedup", lambda env=None: 2.0)
    fast = tmp_path / "fast.yaml"
    fast.write_text(open(NORM).read().replace("precision: bf16", "precision: bf16\nfast: true"))
    cfg = config.load(str(fast))
    rec = config.recipe(cfg)
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    runs = config.runs(cfg, ["qknorm", "fairseq_transformer"], seeds=1)
    for run in runs:
        planned = study_runs.plan(cfg, run, rec, where)
        _, flags = _last(planned.fairseq_args)
        fast_flags = {"--fast-dropout", "--fused-loss", "--packed-decoder", "--fused-kernels"}
        assert (fast_flags & flags) == (set() if run.stock else fast_flags), run.name
        assert planned.where == ("CPU (bf16)" if run.stock else "CPU (bf16, fast path)")
    plain = study_runs.plan(config.load(NORM), runs[0], rec, where).fairseq_args
    assert "--fast-dropout" not in plain
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    with pytest.raises(train_step.UsageError, match="^--fast is the CPU's fast path"):
        study_runs.plan(cfg, next(r for r in runs if not r.stock), rec, where)


def test_precision_is_checked_and_fp32_adds_no_flag(tmp_path, monkeypatch):
    monkeypatch.setattr(hardware, "has_gpu", lambda: True)
    cfg = config.load(CONFIG)
    assert cfg.precision == "fp32" and not cfg.one_recipe.flags
    rec = config.recipe(cfg)
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    for run in config.runs(cfg, ["qknorm", "fairseq_transformer"], seeds=1):
        args = study_runs.plan(cfg, run, rec, where).fairseq_args
        assert not {"--bf16", "--fp16", "--precision"} & set(args)
    bad = tmp_path / "bad.yaml"
    bad.write_text(open(NORM).read().replace("precision: bf16", "precision: fp8"))
    with pytest.raises(StudyError, match="precision 'fp8': use one of fp32, bf16, fp16"):
        config.load(str(bad))
    both = tmp_path / "both.yaml"
    both.write_text(open(NORM).read() + "lr_multipliers: [2.0]\n")
    with pytest.raises(StudyError, match="lr_grid or lr_multipliers, not both"):
        config.load(str(both))


# --- the report on fixture records -----------------------------------------------------------

def _records(tmp_path, runs):
    """A study's records: per run (wall seconds, its dev BLEUs every 10 updates, noise of its test
    output[, noise of its last checkpoint's decoded output]), and the prepared reference the records'
    scores name. (Folders, records folder, refs, hyps: of the best-dev checkpoints, and 'RUN/last' of
    the last ones decoded)."""
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(20)]
    refs = [" ".join(rng.choice(vocab) for _ in range(10)) for _ in range(60)]
    ref = tmp_path / "data" / "gl-en" / "tok" / "test.en"
    ref.parent.mkdir(parents=True)
    ref.write_text("".join(r + "\n" for r in refs))
    records_dir = tmp_path / "results" / "runs" / "gl-en"
    hyps = {}
    for run, (wall, bleus, noise, *last) in runs.items():
        d = records_dir / run
        d.mkdir(parents=True)
        end = f"12:{wall // 60:02d}:{wall % 60:02d}"
        (d / "train.log").write_text(
            "# 2026-01-01T12:00:00Z fairseq-train data-bin\n2026-01-01 12:00:00 | INFO | x | start\n"
            + "".join(_line(f"12:{10 * k // 60:02d}:{10 * k % 60:02d}", "valid",
                            {"valid_loss": 5, "valid_bleu": b, "valid_num_updates": 10 * k}) for k, b in enumerate(bleus, 1))
            + f"2026-01-01 {end} | INFO | x | done\n")
        for key, out, n in ((run, d, noise), *((f"{run}/last", d / "last", x) for x in last)):
            hyps[key] = [" ".join(w if rng.random() > n else rng.choice(vocab) for w in r.split()) for r in refs]
            out.mkdir(exist_ok=True)
            (out / "hyp.txt").write_text("".join(h + "\n" for h in hyps[key]))
            (out / "scores.json").write_text("{}")
        (d / "command.txt").write_text("train: fairseq-train $DATA_BIN/gl-en\ndecode: --beam 4\n")
    return where, str(records_dir), refs, hyps


def test_report_tables_significance_and_curves(tmp_path):
    cfg = config.load(CONFIG)
    cfg.lr_multipliers = [2.0]
    runs = {"postnorm": (600, [1.0, 2.0], 0.5), "postnorm_seed2": (900, [1.5, 2.5], 0.45),
            "qknorm": (660, [2.0, 3.0], 0.2), "qknorm_seed2": (720, [2.0, 3.5], 0.25),
            "postnorm_lr2x": (600, [1.0, 1.5], 0.6), "qknorm_lr2x": (600, [1.0, 1.2], 0.3)}
    where, records_dir, refs, hyps = _records(tmp_path, runs)
    chosen = [r for r in config.runs(cfg, ["postnorm", "qknorm"], seeds=2)]
    assert sorted(r.name for r in chosen) == sorted(runs)
    md = report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])
    text = open(md).read()
    # test BLEU per seed from the records, mean and sample sd (tokenized multi-bleu: textbook BLEU)
    bleu = {r: naive_bleu(h, refs) for r, h in hyps.items()}
    q = [bleu["qknorm"], bleu["qknorm_seed2"]]
    assert f"| qknorm | 2 | {sum(q) / 2:.2f} ± {abs(q[0] - q[1]) / 2 ** 0.5:.2f} ({q[0]:.2f}, {q[1]:.2f}) |" in text
    # wall time per run: postnorm 10 and 15 min (mean 12.5, sd 3.54), qknorm 11 and 12
    assert "| postnorm | 20 20 | 12.5 ± 3.5 (10.0, 15.0) |" in text
    assert "| qknorm | 20 20 | 11.5 ± 0.7 (11.0, 12.0) |" in text
    assert "Total training time: 68.0 min over 6 runs" in text
    # the ranking and the neighbours' test: Welch's t over the two seeds of each (by hand, with scipy's
    # t distribution), the test set's variance added; one pair, so Holm changes nothing
    result = json.load(open(os.path.join(where.results, "study.json")))
    assert "Ranking by mean multi-bleu-detok: qknorm > postnorm; by the last checkpoint: qknorm > postnorm." in text
    (test,) = result["neighbours"]
    p = [bleu["postnorm"], bleu["postnorm_seed2"]]
    assert test["pair"] == ["qknorm", "postnorm"] and test["seeds"] == [2, 2] and test["seed_terms"] == ["own", "own"]
    terms = [statistics.variance(q) / 2, statistics.variance(p) / 2]
    # the test set's share, from the hypotheses: the seeds' sentence statistics, resampled
    stats = {r: bleu_module.multi_bleu_detok(h, [refs]).stats for r, h in hyps.items()}
    sentences = sentence_variance([stats["qknorm"], stats["qknorm_seed2"]], [stats["postnorm"], stats["postnorm_seed2"]],
                                  n_samples=study_stats.N_SAMPLES, seed=12345)
    assert test["sentence_var"] == pytest.approx(sentences, rel=1e-9) and sentences > 0
    var = sum(terms) + sentences
    df = sum(terms) ** 2 / sum(v ** 2 for v in terms)
    t = (statistics.mean(q) - statistics.mean(p)) / var ** 0.5
    assert test["delta"] == pytest.approx(statistics.mean(q) - statistics.mean(p), abs=1e-3)
    assert test["df"] == pytest.approx(df, rel=1e-3)
    assert test["p_two_sided"] == pytest.approx(2 * scipy_stats.t.sf(t, df), rel=1e-3)
    assert test["p_holm"] == test["p_two_sided"] and test["resolved"] == (test["p_two_sided"] < 0.05)
    lo, hi = test["ci95"]
    assert f"| qknorm vs postnorm | 2 vs 2 | {test['delta']:+.2f} | [{lo:+.2f}, {hi:+.2f}] | {df:.1f} | " in text
    # both LRs: the ordering holds at 1x and 2x
    assert result["rankings"] == {"1": ["qknorm", "postnorm"], "2": ["qknorm", "postnorm"]}
    assert result["hold_at_every_lr"] == [["qknorm", "postnorm"]]
    assert "- Orderings that hold at every learning rate, by both checkpoints: qknorm > postnorm\n" in text
    # the last checkpoint: not decoded in these records; the best is the last where the last validation is best
    assert result["runs"]["qknorm"]["last_source"] == "best"
    assert result["runs"]["postnorm"]["curve"][1] == {"updates": 20, "wall_s": 20, "bleu": 2.0}
    # a report of fewer runs than the study's: its command names them
    assert "Command: `bash scripts/study.sh --report-only --runs 'postnorm qknorm postnorm_seed2 qknorm_seed2 postnorm_lr2x " \
           "qknorm_lr2x'`" in text and "Settings: configs/studies/gl-en.yaml;" in text
    assert "published" not in text  # the papers' split differs: no published columns
    png = os.path.join(where.results, "dev_bleu.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def _pooled_report(tmp_path):
    """The report of qknorm and postnorm with two seeds each and prenorm with one: (study.json, study.md,
    references, hypotheses)."""
    cfg = config.load(CONFIG)
    cfg.lr_multipliers = []
    runs = {"postnorm": (600, [1.0, 2.0], 0.5), "postnorm_seed2": (900, [1.5, 2.5], 0.45),
            "qknorm": (660, [2.0, 3.0], 0.2), "qknorm_seed2": (720, [2.0, 3.5], 0.25), "prenorm": (600, [1.0, 2.0], 0.35)}
    where, records_dir, refs, hyps = _records(tmp_path, runs)
    chosen = [r for r in config.runs(cfg, ["postnorm", "prenorm", "qknorm"], seeds=2) if r.name in runs]
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    return json.load(open(os.path.join(where.results, "study.json"))), text, refs, hyps


def test_report_pools_the_seed_spread_for_a_one_seed_system_and_holm_corrects(tmp_path):
    result, text, refs, hyps = _pooled_report(tmp_path)
    bleu = {r: naive_bleu(h, refs) for r, h in hyps.items()}
    post, qk = [bleu["postnorm"], bleu["postnorm_seed2"]], [bleu["qknorm"], bleu["qknorm_seed2"]]
    # one degree of freedom from each two-seed system: the mean of their variances
    pooled = (statistics.variance(post) + statistics.variance(qk)) / 2
    assert result["pooled_seed_sd"] == pytest.approx([pooled ** 0.5, 2], rel=1e-4)
    assert "Ranking by mean multi-bleu-detok: qknorm > prenorm > postnorm;" in text
    first, second = result["neighbours"]
    assert first["seed_terms"] == ["own", "pooled"] and second["seed_terms"] == ["pooled", "own"]
    var = pooled + statistics.variance(post) / 2 + second["sentence_var"]
    df = (var - second["sentence_var"]) ** 2 / (pooled ** 2 / 2 + (statistics.variance(post) / 2) ** 2 / 1)
    t_stat = (bleu["prenorm"] - statistics.mean(post)) / var ** 0.5
    assert second["p_two_sided"] == pytest.approx(2 * scipy_stats.t.sf(t_stat, df), rel=1e-3)
    # Holm over the two pairs, by hand: the smaller p doubled, the larger raised to it
    small, large = sorted(t["p_two_sided"] for t in (first, second))
    assert sorted(t["p_holm"] for t in (first, second)) == pytest.approx([min(1, 2 * small), min(1, max(2 * small, large))])
    assert "| prenorm vs postnorm | 1 (pooled sd) vs 2 |" in text
    # the one-seed row shows the pooled sd its tests use beside its score
    rows = {r["system"]: r for r in result["systems"]}
    assert f" | {rows['prenorm']['multi_bleu_detok'][0]:.2f} ± {pooled ** 0.5:.2f} (pooled sd) | " in text
    # no LR section: the dev curves are shown with the plateau table
    assert text.count("](dev_bleu.png)") == 1 and "(test_bleu_lr.png)" not in text
    assert text.index("## Whether each run levelled off") < text.index("](dev_bleu.png)")
    assert f"its seed term is the seed standard deviation pooled over the other systems, {pooled ** 0.5:.2f} (2 " in text
    assert "The family of tests: the 2 pairs of neighbours in the ranking" in text
    for test in (first, second):
        assert test["resolved"] == (test["p_holm"] < 0.05)
        assert (f" | {test['p_holm_text']} | {test['resolvable_delta']:.2f} | {'yes' if test['resolved'] else 'not resolved'} |"
                in text)
    assert not re.search(r"\bties?\b", text) and "< 0." not in text


def test_report_gives_the_smallest_difference_each_neighbour_test_resolves(tmp_path):
    result, text, _, _ = _pooled_report(tmp_path)
    seeds = {r["system"]: r["multi_bleu_detok_per_seed"] for r in result["systems"]}
    pooled = (result["pooled_seed_sd"][0] ** 2, result["pooled_seed_sd"][1])
    tests = result["neighbours"]
    for i, t in enumerate(tests):
        hi, lo = seeds[t["pair"][0]], seeds[t["pair"][1]]

        def adjusted(delta, i=i, t=t, hi=hi, lo=lo):
            """The pair's Holm-adjusted p were its delta DELTA: its first system's seeds shifted by the same amount."""
            shifted = [x - statistics.mean(hi) + statistics.mean(lo) + delta for x in hi]
            p = [u["p_two_sided"] for u in tests]
            p[i] = seed_t_test(shifted, lo, sentence_var=t["sentence_var"], pooled=pooled)["p_two_sided"]
            return holm(p)[i]

        # brute force: the first delta of a fine grid at which the adjusted p falls below 0.05
        step = t["se"] / 500
        k = next(k for k in range(1, 10 ** 6) if adjusted(k * step) < 0.05)
        assert (k - 1) * step <= t["resolvable_delta"] <= k * step
        assert adjusted(t["delta"]) == pytest.approx(t["p_holm"])
        assert t["resolved"] == (abs(t["delta"]) >= t["resolvable_delta"])
    least = min(tests, key=lambda t: t["resolvable_delta"])
    assert (f"this design resolves, at these seeds and this test set: {least['resolvable_delta']:.2f} BLEU "
            f"({least['pair'][0]} vs {least['pair'][1]}, seeds ") in text
    assert "resolves \\|delta\\| ≥ |" in text and "found by bisection on Welch's t" in text


def test_report_shows_what_the_pooled_seed_sd_halved_or_doubled_does_to_each_verdict(tmp_path):
    result, text, _, _ = _pooled_report(tmp_path)
    seeds = {r["system"]: r["multi_bleu_detok_per_seed"] for r in result["systems"]}
    sd, df_pooled = result["pooled_seed_sd"]
    first, second = result["neighbours"]  # qknorm vs prenorm (2 vs 1), prenorm vs postnorm (1 vs 2)
    assert [first["pair"], second["pair"]] == [["qknorm", "prenorm"], ["prenorm", "postnorm"]]

    def p(test, own, scale):
        """Welch's t by hand: the two-seed system's own term, the one-seed system's the pooled sd times SCALE."""
        own_var, pooled_var = statistics.variance(seeds[own]) / 2, (sd * scale) ** 2
        df = (own_var + pooled_var) ** 2 / (own_var ** 2 / 1 + pooled_var ** 2 / df_pooled)
        t_stat = abs(test["delta"]) / (own_var + pooled_var + test["sentence_var"]) ** 0.5
        return 2 * scipy_stats.t.sf(t_stat, df)

    entries = result["pooled_sd_sensitivity"]["neighbours"]
    assert [e["pair"] for e in entries] == [first["pair"], second["pair"]]
    for key, scale in (("sd_x0.5", 0.5), ("sd_x2", 2.0)):
        a, b = p(first, "qknorm", scale), p(second, "postnorm", scale)
        small, large = sorted((a, b))
        holm_ab = {a: min(1, 2 * small), b: min(1, max(2 * small, large))} if a <= b else \
            {b: min(1, 2 * small), a: min(1, max(2 * small, large))}
        for e, q in zip(entries, (a, b)):
            assert e[key]["p_holm"] == pytest.approx(holm_ab[q], rel=1e-6)
            assert e[key]["resolved"] == (holm_ab[q] < 0.05)
    for e, t in zip(entries, (first, second)):
        assert e["as_tested"] == {"p_holm": t["p_holm"], "resolved": t["resolved"]}
    assert f"| qknorm vs prenorm | {entries[0]['sd_x0.5']['p_holm']:.3f}" in text
    assert f"each is given the sd pooled over postnorm, qknorm, {sd:.2f} ({df_pooled} degrees of freedom)" in text
    # the claims of the config (gl-en.yaml's) whose systems have rows are retested alike
    claims = {tuple(c["pair"]) for c in result["claims"] if "pooled" in c["seed_terms"]}
    assert {tuple(e["pair"]) for e in result["pooled_sd_sensitivity"]["claims"]} == claims


def test_a_run_levels_off_when_its_last_running_median_is_no_higher_than_an_earlier_one():
    rng = random.Random(1)
    curves = {"rising": [5 + 0.4 * k + rng.uniform(-0.5, 0.5) for k in range(14)],
              # flat but noisy, its single best score at its last validation
              "flat": [10 + rng.uniform(-0.8, 0.8) for _ in range(13)] + [11.5],
              "short": [1.0 * k for k in range(9)]}
    found = {name: {"log": {"curve": [{"updates": 200 * (k + 1), "wall_s": k, "bleu": b} for k, b in enumerate(c)]}}
             for name, c in curves.items()}
    rows = {r["run"]: r for r in study_stats.plateau_rows(found)}
    for name in ("rising", "flat"):
        c = np.array(curves[name])
        medians = np.median(np.lib.stride_tricks.sliding_window_view(c, 5), axis=1)  # one per 5 validations
        earlier = medians[:-5]  # the windows that end before the last window starts
        r = rows[name]
        assert r["median_last"] == pytest.approx(medians[-1]) and r["median_before"] == pytest.approx(earlier.max())
        assert r["median_before_at"] == 200 * (int(np.argmax(earlier)) + 5)
        assert r["median_rise"] == pytest.approx(medians[-1] - medians[-6])
        assert r["levelled_off"] == bool(medians[-1] <= earlier.max())
    # the single-point rule reads the flat run's last spike as improvement; the running median does not
    assert rows["flat"]["levelled_off"] is True and rows["flat"]["before_last"] is False
    assert rows["rising"]["levelled_off"] is False
    # nine validations: no window before the last that does not overlap it
    assert rows["short"]["levelled_off"] is None and rows["short"]["median_last"] is None


def test_a_closed_study_trains_no_more_runs(capsys):
    from qknorm_pipeline.study import __main__ as study_main

    assert config.load(NORM).closed is True
    assert study_main.main(["--config", NORM, "--runs", "qknorm_lr5e-4"]) == 1
    assert capsys.readouterr().err.strip() == (
        "[study] error: configs/studies/gl-en-norm.yaml: the study is closed (closed: true), it trains no more runs: "
        "rebuild its report with --report-only, or remove closed: to train")


def test_report_with_one_seed_each_tests_over_sentences_only(tmp_path):
    cfg = config.load(CONFIG)
    cfg.lr_multipliers = []
    # a study of these two runs only: the report holds all of it
    cfg.systems = {s: cfg.systems[s] for s in ("postnorm", "qknorm")}
    cfg.stock.rows = {}
    for s in cfg.systems.values():
        s.seeds = 1
    where, records_dir, refs, hyps = _records(tmp_path, {"postnorm": (600, [1.0, 2.0], 0.5),
                                                         "qknorm": (660, [2.0, 3.0], 0.3)})
    chosen = config.runs(cfg, ["postnorm", "qknorm"], seeds=1)
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    (test,) = json.load(open(os.path.join(where.results, "study.json")))["neighbours"]
    # no seed spread known: a normal test with the test set's variance alone
    assert test["seed_terms"] == ["unknown", "unknown"] and test["df"] is None
    z = test["delta"] / test["sentence_var"] ** 0.5
    assert test["p_two_sided"] == pytest.approx(2 * scipy_stats.norm.sf(abs(z)), rel=1e-6)
    assert "| qknorm vs postnorm | 1 vs 1 |" in text and " | ∞ | " in text
    assert "No system has two seeds, so no seed spread is known: postnorm, qknorm are tested over test sentences only" in text
    # however small its p, the test set alone resolves no pair: the seeds' spread is unknown
    assert test["resolved"] is False and test["seed_spread_known"] is False
    assert text.count("| not resolved (no seed spread known) |") == 1 and "| yes |" not in text
    assert "the 1 pair of neighbours" in text
    # a budget raised after the runs were recorded: the report names the runs short of it
    assert "Command: `bash scripts/study.sh --report-only`" in text  # all of the study: no --runs
    assert "\nRuns: all 2 of the study's. Short of the budget of 2000 updates: postnorm (20), qknorm (20).\n" in text
    assert json.load(open(os.path.join(where.results, "study.json")))["short_of_budget"] == {"postnorm": 20, "qknorm": 20}


def test_report_of_a_grid_study_compares_each_system_at_its_best_rate(tmp_path):
    cfg = config.load(NORM)
    cfg.closed = False  # a study still under way
    cfg.lr_grid = [1e-3, 2e-3]
    cfg.budget.max_update = 20  # the records' updates: none is short of the budget
    # postnorm's best dev BLEU at 2e-3, qknorm's at 1e-3; postnorm_lr1e-3's last checkpoint decoded apart
    runs = {"postnorm_lr1e-3": (600, [1.0, 2.0], 0.5, 0.05), "postnorm_lr2e-3": (600, [1.0, 3.0], 0.45),
            "postnorm_lr2e-3_seed2": (660, [1.5, 2.5], 0.5), "qknorm_lr1e-3": (600, [2.0, 4.0], 0.2),
            "qknorm_lr2e-3": (600, [2.0, 1.0], 0.4), "qknorm_lr1e-3_seed2": (720, [2.0, 3.5], 0.25)}
    where, records_dir, refs, hyps = _records(tmp_path, runs)
    best = records.best_rates(cfg, records_dir)
    assert best == {"postnorm": 2e-3, "qknorm": 1e-3}
    chosen = config.runs(cfg, ["postnorm", "qknorm"], seeds=2, best=best)
    assert sorted(r.name for r in chosen) == sorted(runs)
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    bleu = {r: naive_bleu(h, refs) for r, h in hyps.items()}
    result = json.load(open(os.path.join(where.results, "study.json")))
    rows = {r["system"]: r for r in result["systems"]}
    assert rows["postnorm"]["multi_bleu_per_seed"] == pytest.approx([bleu["postnorm_lr2e-3"], bleu["postnorm_lr2e-3_seed2"]],
                                                                    abs=1e-3)
    assert rows["qknorm"]["multi_bleu_per_seed"] == pytest.approx([bleu["qknorm_lr1e-3"], bleu["qknorm_lr1e-3_seed2"]],
                                                                  abs=1e-3)
    assert "## Test BLEU at each system's best learning rate of the grid" in text
    assert "| system | 0.001 LR: best / last (dev) | 0.002 LR: best / last (dev) |" in text
    # each cell: the best-dev and the last checkpoint's test multi-bleu-detok; qknorm_lr2e-3's last checkpoint (its
    # last validation below its best) was not decoded; postnorm_lr1e-3's was, and scores above its best-dev one
    detok = {r: bleu_module.multi_bleu_detok(h, [refs]).score for r, h in hyps.items()}
    assert f"| qknorm | {detok['qknorm_lr1e-3']:.2f} / {detok['qknorm_lr1e-3']:.2f} (4.00) | {detok['qknorm_lr2e-3']:.2f} " \
           "/ n/a (2.00) |" in text
    assert f"| postnorm | {detok['postnorm_lr1e-3']:.2f} / {detok['postnorm_lr1e-3/last']:.2f} (2.00) |" in text
    assert detok["postnorm_lr1e-3/last"] > detok["qknorm_lr1e-3"] > detok["postnorm_lr1e-3"]
    # so the last checkpoints rank postnorm first at 1e-3, where the best-dev ones rank qknorm first
    assert result["rankings"]["0.001"] == ["qknorm", "postnorm"]
    assert result["rankings_last_checkpoint"] == {"0.001": ["postnorm", "qknorm"], "0.002": ["postnorm"]}
    # no ordering holds by the last checkpoint: qknorm has none at 2e-3
    assert result["hold_at_every_lr_last_checkpoint"] == []
    assert "- Ranking at 0.001: best-dev checkpoint qknorm > postnorm; last checkpoint postnorm > qknorm\n" in text
    assert "; last checkpoint postnorm (no last checkpoint: qknorm)\n" in text
    gap = detok["postnorm_lr1e-3/last"] - detok["postnorm_lr1e-3"]
    assert (f"- Best-dev against last checkpoint: a run's test multi-bleu-detok moves by up to {gap:.2f} (postnorm_lr1e-3: "
            f"{detok['postnorm_lr1e-3']:.2f} / {detok['postnorm_lr1e-3/last']:.2f}), against deltas of ") in text
    # the runs off the best rate have their own rows in the wall-time table
    assert "| postnorm_lr1e-3 | 20 | 10.0 |" in text and "| qknorm_lr2e-3 | 20 | 10.0 |" in text
    assert result["runs"]["qknorm_lr2e-3"]["lr"] == 2e-3
    # every rate of the grid (and its plot), then the ranking at the best rates
    assert text.index("## Each system at every learning rate") < text.index("## Test BLEU at each system's best") \
        < text.index("## Which differences") < text.index("## Whether each run levelled off")
    with open(os.path.join(where.results, "test_bleu_lr.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    # both plots are shown in the LR section, once each
    lr_part = text[text.index("## Each system at every learning rate"):text.index("## Test BLEU at each system's best")]
    assert lr_part.count("](test_bleu_lr.png)") == text.count("](test_bleu_lr.png)") == 1
    assert lr_part.count("](dev_bleu.png)") == text.count("](dev_bleu.png)") == 1
    # qknorm_lr2e-3 peaked at its first validation (update 10); every other run at its last (20); two
    # validations are too few for the running median
    assert ("Runs that levelled off: 1 of 6 by the single-point rule (best dev BLEU before the last validation) (6 runs "
            "with fewer than 10 validations not judged by the running median). Did most runs level off before the budget "
            "ended, as a study's budget aims? no by the single-point rule.") in text
    assert "| qknorm_lr2e-3 | 2.00 | 10 | n/a | n/a | n/a | n/a | yes |" in text
    assert "| qknorm_lr1e-3 | 4.00 | 20 | n/a | n/a | n/a | n/a | no |" in text
    assert {r["run"]: r["before_last"] for r in result["plateau"]}["qknorm_lr2e-3"] is True
    # the config's claims name systems this report has not: no claims section
    assert "## What the data say" not in text and result["claims"] == []
    # what the report lacks of the study: 6 systems x 2 rates, then seeds 2 and 3 of each at its best rate
    assert result["runs_in_study"] == 6 * 2 + 6 * 2
    assert result["not_named_yet"] == {s: [2, 3] for s in ("prenorm", "scalenorm", "fairseq_transformer", "fairseq_prenorm")}
    assert ("\nRuns: 6 of the study's 24; not in this report: prenorm_lr1e-3, scalenorm_lr1e-3, fairseq_transformer_lr1e-3, "
            "fairseq_prenorm_lr1e-3, prenorm_lr2e-3, scalenorm_lr2e-3, fairseq_transformer_lr2e-3, fairseq_prenorm_lr2e-3, "
            "postnorm_lr2e-3_seed3, qknorm_lr1e-3_seed3; seeds 2, 3 of prenorm, scalenorm, fairseq_transformer, "
            "fairseq_prenorm at each one's best rate of the grid (named once its grid runs are recorded; until then its "
            "best rate, and what follows from it here, can change).\n") in text
    assert result["closed"] is False
    # the study closed (closed: true in its config): the runs it lacks were not run
    cfg.closed = True
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    assert ("\nRuns: 6 of the study's 24. The study is closed (closed: in configs/studies/gl-en-norm.yaml); not run: "
            "prenorm_lr1e-3, scalenorm_lr1e-3, fairseq_transformer_lr1e-3, fairseq_prenorm_lr1e-3, prenorm_lr2e-3, "
            "scalenorm_lr2e-3, fairseq_transformer_lr2e-3, fairseq_prenorm_lr2e-3, postnorm_lr2e-3_seed3, "
            "qknorm_lr1e-3_seed3; seeds 2, 3 of prenorm, scalenorm, fairseq_transformer, fairseq_prenorm at each one's "
            "best rate of the grid.\n") in text
    assert json.load(open(os.path.join(where.results, "study.json")))["closed"] is True


def test_report_tests_the_papers_claims_as_a_holm_family(tmp_path):
    cfg = config.load(NORM)
    cfg.lr_grid = [1e-3]
    cfg.claims = [config.Claim("Paper A", "qknorm", "postnorm"), config.Claim("Paper B", "postnorm", "qknorm"),
                  config.Claim("Paper C", "prenorm", "postnorm")]  # no prenorm rows: not tested
    runs = {"postnorm_lr1e-3": (600, [1.0, 2.0], 0.5), "postnorm_lr1e-3_seed2": (660, [1.5, 2.5], 0.45),
            "qknorm_lr1e-3": (600, [2.0, 4.0], 0.1), "qknorm_lr1e-3_seed2": (720, [2.0, 3.5], 0.12)}
    where, records_dir, refs, hyps = _records(tmp_path, runs)
    chosen = config.runs(cfg, ["postnorm", "qknorm"], seeds=2, best={"postnorm": 1e-3, "qknorm": 1e-3})
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    result = json.load(open(os.path.join(where.results, "study.json")))
    (neighbour,) = result["neighbours"]
    a, b = result["claims"]
    # the same pair as the neighbours' test, each sign; Holm over the family of two claims
    assert a["pair"] == ["qknorm", "postnorm"] and b["pair"] == ["postnorm", "qknorm"]
    assert a["delta"] == pytest.approx(neighbour["delta"]) and b["delta"] == pytest.approx(-neighbour["delta"])
    assert a["p_two_sided"] == pytest.approx(neighbour["p_two_sided"]) == pytest.approx(b["p_two_sided"])
    assert a["p_holm"] == pytest.approx(min(1.0, 2 * a["p_two_sided"])) == pytest.approx(b["p_holm"])
    resolved = a["p_holm"] < 0.05
    assert (a["verdict"], b["verdict"]) == (("supported", "contradicted") if resolved else ("not resolved",) * 2)
    assert f"| qknorm > postnorm (Paper A) | 2 vs 2 | {a['delta']:+.2f} |" in text
    assert f"| {a['verdict']} |" in text and "the family: these 2 claims, Holm-adjusted" in text
    assert text.index("## Which differences") < text.index("## What the data say about the papers' claims")
    assert "Paper C" not in text


def test_report_compares_our_speed_with_the_stock_rows_run_by_run(tmp_path):
    cfg = config.load(NORM)
    cfg.lr_grid = [1e-3]
    cfg.budget.max_update = 20
    # 20 updates each: ours in 10 and 15 min, stock in 8 min
    runs = {"postnorm_lr1e-3": (600, [1.0, 2.0], 0.5), "qknorm_lr1e-3": (900, [2.0, 3.0], 0.2),
            "fairseq_transformer_lr1e-3": (480, [1.0, 2.5], 0.4)}
    where, records_dir, refs, hyps = _records(tmp_path, runs)
    machine = "2026-01-01 12:00:01 | INFO | qknorm_pipeline.fairseq_train | machine: {}\n"
    for run, logged in (("postnorm_lr1e-3", ["CPU A, 2 CPUs"]), ("qknorm_lr1e-3", ["CPU A, 2 CPUs", "CPU B"])):
        start, rest = open(os.path.join(records_dir, run, "train.log")).read().split("\n", 1)
        segment = start + "\n" + machine.format(logged[0]) + rest
        if len(logged) > 1:  # a second start, logged before it validates anything
            segment += start.replace("12:00:00Z", "13:00:00Z") + "\n" + machine.format(logged[1]).replace("12:", "13:")
        open(os.path.join(records_dir, run, "train.log"), "w").write(segment)
    chosen = config.runs(cfg, ["postnorm", "qknorm", "fairseq_transformer"], seeds=1)
    text = open(report.write(cfg, chosen, where, records_dir, command=["bash", "scripts/study.sh", "--report-only"])).read()
    ours, stock = (20 / 600 + 20 / 900) / 2, 20 / 480
    assert (f"Mean speed over the runs: ours {ours:.3f} updates/s (2 runs), stock fairseq {stock:.3f} (1 run): "
            f"ours at {ours / stock:.2f}× stock's.") in text
    # the machine each start of a run logged: postnorm on A, qknorm on A then (resumed) on B, the
    # stock run's log from before the entry point logged one
    assert "| postnorm | 20 | 10.0 | 0.03 | M1 |" in text and "| qknorm | 20 | 15.0 | 0.02 | M1+M2 |" in text
    assert "| fairseq_transformer | 20 | 8.0 | 0.04 | ? |" in text
    assert ("Machines (each start of a run logs its own): M1 = CPU A, 2 CPUs (2 runs); M2 = CPU B (1 run); "
            "? = not recorded (1 run: a start whose log names no machine).") in text
    assert json.load(open(os.path.join(where.results, "study.json")))["runs"]["qknorm_lr1e-3"]["machines"] == \
        ["CPU A, 2 CPUs", "CPU B"]
    # without a stock run there is nothing to compare
    text = open(report.write(cfg, config.runs(cfg, ["postnorm", "qknorm"], seeds=1), where, records_dir,
                             command=["bash", "scripts/study.sh", "--report-only"])).read()
    assert "Mean speed" not in text


def test_a_claim_must_name_systems_of_the_study(tmp_path):
    bad = tmp_path / "bad.yaml"
    layer = yaml.safe_load(open(NORM))
    layer["claims"].append({"paper": "Nowhere", "better": "qknorm", "worse": "rmsnorm"})
    bad.write_text(yaml.safe_dump(layer))
    with pytest.raises(StudyError, match=r"claims: 'rmsnorm' \(Nowhere\) is not one of its systems \(postnorm "):
        config.load(str(bad))


def test_report_names_a_missing_record(tmp_path):
    cfg = config.load(CONFIG)
    where, records_dir, _, _ = _records(tmp_path, {"postnorm": (600, [1.0, 2.0], 0.5)})
    chosen = config.runs(cfg, ["postnorm", "qknorm"], seeds=1, multipliers=False)
    with pytest.raises(StudyError, match=r"no record of qknorm in .*runs/gl-en/: finish them first"):
        report.write(cfg, chosen, where, records_dir)


def test_the_study_report_command_keeps_the_config_and_budget_only():
    from qknorm_pipeline.study.__main__ import parser, report_command

    assert report_command(parser().parse_args([])) == ["bash", "scripts/study.sh", "--report-only"]
    a = parser().parse_args(["--config", "my study.yaml", "--max-update", "20", "--runs", "qknorm", "--source-dir", "x"])
    assert report_command(a) == ["bash", "scripts/study.sh", "--config", "my study.yaml", "--max-update", "20",
                                 "--report-only"]


def test_a_ranking_shows_scores_that_print_alike_as_equal():
    score = {"a": 10.004, "b": 9.996, "c": 9.0, "d": 8.999}.get
    assert render.ranking_text(["a", "b", "c", "d"], score) == "a = b > c = d"
    assert render.ranking_text(["c"], score) == "c"


def test_holm_family_prints_an_adjusted_p_just_below_alpha_with_the_digits_that_show_it():
    (t,) = study_stats.holm_family([{"p_two_sided": 0.04999, "seed_spread_known": True}])
    assert t["resolved"] is True and t["p_holm_text"] == "0.04999"


def test_lr_conclusions_keep_only_orderings_that_hold_at_both():
    rows = [{"system": s, "by_lr": {1.0: {"test": a}, 2.0: {"test": b}}}
            for s, a, b in (("a", 10, 9), ("b", 9, 10), ("c", 8, 7), ("d", 8, 7))]
    rankings, hold = study_stats.lr_conclusions(rows)
    assert rankings == {1.0: ["a", "b", "c", "d"], 2.0: ["b", "a", "c", "d"]}
    # a and b swap; c and d tie at both: no ordering between them
    assert hold == [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")]
    # a grid not yet complete (an interim report): a system without a rate is left out of its ranking
    del rows[0]["by_lr"][2.0]
    rankings, hold = study_stats.lr_conclusions(rows)
    assert rankings == {1.0: ["a", "b", "c", "d"], 2.0: ["b", "c", "d"]}
    assert ("a", "c") in hold and ("b", "c") in hold
    # by the last checkpoint: one not decoded leaves its system out of that rate's ranking and out of
    # every ordering that would need it
    for r, lasts in zip(rows, ({1.0: 9}, {1.0: 9.5, 2.0: None}, {1.0: 7, 2.0: 6}, {1.0: 8, 2.0: 5})):
        for m, v in lasts.items():
            r["by_lr"][m]["last"] = v
    rankings, hold = study_stats.lr_conclusions(rows, "last")
    assert rankings == {1.0: ["b", "a", "d", "c"], 2.0: ["c", "d"]}
    assert hold == [("b", "a"), ("a", "c"), ("a", "d")]


def test_a_bf16_study_on_a_cpu_without_bf16_stops_before_any_work_naming_its_config(monkeypatch, capsys, tmp_path):
    from qknorm_pipeline.study import __main__ as study_main

    monkeypatch.setattr(hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(study_main, "prepare_data", lambda *a: pytest.fail("prepared data before the check"))
    load = config.load
    monkeypatch.setattr(config, "load", lambda path: dataclasses.replace(load(path), closed=False))  # one not closed
    assert study_main.main(["--config", NORM]) == 1
    err = capsys.readouterr().err.strip()
    assert err == ("[study] error: configs/studies/gl-en-norm.yaml: precision: bf16: this CPU has no native bf16 "
                   "instructions (AVX512-BF16, AMX or ARM BF16), so bf16 would run emulated, slower than fp32; run the "
                   "study on a GPU or on a CPU that has them (every run of a study trains in its config's precision)")
    fp16 = tmp_path / "fp16.yaml"
    fp16.write_text(open(NORM).read().replace("precision: bf16", "precision: fp16"))
    assert study_main.main(["--config", str(fp16)]) == 1
    err = capsys.readouterr().err.strip()
    assert err.endswith("precision: fp16 needs a GPU; none is visible to torch: run the study on a GPU (every run "
                        "of a study trains in its config's precision)"), err


def test_a_dry_run_of_a_bf16_study_on_a_cpu_without_bf16_shows_its_runs_and_says_this_machine_cannot_train_them(
        monkeypatch, capsys, tmp_path):
    from qknorm_pipeline.study import __main__ as study_main

    monkeypatch.setattr(hardware, "has_gpu", lambda: False)
    monkeypatch.setattr(hardware, "cpu_has_bf16", lambda: False)
    monkeypatch.setattr(study_main, "prepare_data", lambda *a: None)
    monkeypatch.setenv("RESULTS_DIR", str(tmp_path / "results"))
    runs = "qknorm_lr5e-4 fairseq_prenorm_lr5e-4"
    assert study_main.main(["--config", NORM, "--runs", runs, "--dry-run"]) == 0
    out, err = capsys.readouterr()
    assert ("] note: this machine could not train these runs: configs/studies/gl-en-norm.yaml: precision: bf16: "
            "this CPU has no native bf16 instructions") in err
    # each run's state and the command its record would hold (no device flag), as on a machine that can train it
    for name in runs.split():
        train = re.search(rf"^== {name}: to train\ntrain: (.*)$", out, re.M)
        assert train and "--bf16" in train.group(1) and "--cpu" not in train.group(1), out
    assert "--arch transformer_qknorm" in out and "--decoder-normalize-before" in out
    # the runs themselves are refused, ours and stock alike
    cfg = config.load(NORM)
    rec = config.recipe(cfg)
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results"))).under(cfg.name)
    for run in config.runs(cfg, ["qknorm", "fairseq_prenorm"], 1):
        with pytest.raises(train_step.UserError, match="^--precision bf16: this CPU has no native bf16"):
            study_runs.plan(cfg, run, rec, where)


def test_a_study_name_is_one_folder_name(tmp_path):
    bad = tmp_path / "escape.yaml"
    bad.write_text(open(NORM).read().replace("name: study-gl-en-norm", "name: ../../escape"))
    assert "name: ../../escape" in bad.read_text()
    with pytest.raises(StudyError, match=rf"^{bad}: name '../../escape': a name of letters, digits and _ . \+ -"):
        config.load(str(bad))


def test_each_system_keeps_its_colour_in_both_plots(monkeypatch):
    from qknorm_pipeline import plots

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, out: figures.append(fig) or out)
    cfg = config.load(NORM)
    systems = config.all_systems(cfg)
    curve = [{"updates": 10, "wall_s": 5, "bleu": 1.0}, {"updates": 20, "wall_s": 9, "bleu": 2.0}]
    # qknorm's runs come first, and prenorm has no LR row: neither shifts a colour
    found = {name: {"run": config.StudyRun(name, system, 1, 1.0, False, lr), "log": {"curve": curve}, "main": True}
             for name, system, lr in (("qknorm_lr1e-3", "qknorm", 1e-3), ("postnorm_lr1e-3", "postnorm", 1e-3))}
    report.plot(found, systems, "dev.png", "t")
    lrs = [{"system": s, "by_lr": {1e-3: {"test": 1.0}, 2e-3: {"test": 2.0}}} for s in ("postnorm", "qknorm")]
    report.lr_plot(cfg, lrs, {"postnorm": 1e-3, "qknorm": 1e-3}, "lr.png", "t")
    cycle = plots.plt.rcParams["axes.prop_cycle"].by_key()["color"]
    dev, lr = figures
    for ax in dev.axes:
        assert {line.get_label(): line.get_color() for line in ax.lines} == {
            "qknorm LR 0.001 seed 1": cycle[systems.index("qknorm")], "postnorm LR 0.001 seed 1": cycle[systems.index("postnorm")]}
    assert {line.get_label(): line.get_color() for line in lr.axes[0].lines if not line.get_label().startswith("_")} == {
        "postnorm": cycle[systems.index("postnorm")], "qknorm": cycle[systems.index("qknorm")]}
    assert cycle[systems.index("qknorm")] != cycle[1]  # qknorm is not the second system: the test can tell
