"""The gl->en study (qknorm_pipeline/study/): its runs and their flags, wall time and dev-BLEU curves
from fairseq logs across resumptions, record comparison, and the report on fixture records
(tests/system runs scripts/study.sh)."""
import json
import os
import random
import re

import pytest

from qknorm_pipeline import recipes
from qknorm_pipeline.paths import Folders
from qknorm_pipeline.study import config, records, report
from qknorm_pipeline.study.config import StudyError

from helpers import REPO, log_line, naive_bleu

CONFIG = os.path.join(REPO, "configs", "studies", "gl-en.yaml")


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
    assert records.record_change(rec, rec.replace(" --lr 7e-4", "")) == "different: train line has 5 words against 3"
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


# --- the report on fixture records -----------------------------------------------------------

def _records(tmp_path, runs):
    """A study's records: per run (wall seconds, two dev BLEUs, noise of its test output), and the
    prepared reference the records' scores name. (Folders, records folder, refs, hyps)."""
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(20)]
    refs = [" ".join(rng.choice(vocab) for _ in range(10)) for _ in range(60)]
    ref = tmp_path / "data" / "gl-en" / "tok" / "test.en"
    ref.parent.mkdir(parents=True)
    ref.write_text("".join(r + "\n" for r in refs))
    records_dir = tmp_path / "results" / "runs" / "gl-en"
    hyps = {}
    for run, (wall, bleus, noise) in runs.items():
        d = records_dir / run
        d.mkdir(parents=True)
        end = f"12:{wall // 60:02d}:{wall % 60:02d}"
        (d / "train.log").write_text(
            "# 2026-01-01T12:00:00Z fairseq-train data-bin\n2026-01-01 12:00:00 | INFO | x | start\n"
            + _line("12:00:10", "valid", {"valid_loss": 5, "valid_bleu": bleus[0], "valid_num_updates": 10})
            + _line("12:00:20", "valid", {"valid_loss": 4, "valid_bleu": bleus[1], "valid_num_updates": 20})
            + f"2026-01-01 {end} | INFO | x | done\n")
        hyps[run] = [" ".join(w if rng.random() > noise else rng.choice(vocab) for w in r.split()) for r in refs]
        (d / "hyp.txt").write_text("".join(h + "\n" for h in hyps[run]))
        (d / "scores.json").write_text("{}")
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
    md = report.write(cfg, chosen, where, records_dir, command="bash scripts/study.sh")
    text = open(md).read()
    # test BLEU per seed from the records, mean and sample sd (tokenized multi-bleu: textbook BLEU)
    bleu = {r: naive_bleu(h, refs) for r, h in hyps.items()}
    q = [bleu["qknorm"], bleu["qknorm_seed2"]]
    assert f"| qknorm | 2 | {sum(q) / 2:.2f} ± {abs(q[0] - q[1]) / 2 ** 0.5:.2f} ({q[0]:.2f}, {q[1]:.2f}) |" in text
    # wall time per run: postnorm 10 and 15 min (mean 12.5, sd 3.54), qknorm 11 and 12
    assert "| postnorm | 20 20 | 12.5 ± 3.5 (10.0, 15.0) |" in text
    assert "| qknorm | 20 20 | 11.5 ± 0.7 (11.0, 12.0) |" in text
    assert "Total training time: 68.0 min over 6 runs" in text
    # the ranking and the neighbours' test: qknorm clearly ahead, its interval above 0
    result = json.load(open(os.path.join(where.results, "study.json")))
    assert "Ranking by mean multi-bleu-detok: qknorm > postnorm." in text
    (test,) = result["neighbours"]
    assert test["pair"] == ["qknorm", "postnorm"] and test["seeds"] == [2, 2]
    assert test["resolved"] and test["ci95"][0] > 0 and test["p_two_sided"] < 0.01
    assert re.search(r"\| qknorm vs postnorm \| 2 vs 2 \| \+[\d.]+ \| \[\+[\d.]+, \+[\d.]+\] \| < 0\.0002 \| yes \|", text)
    # both LRs: the ordering holds at 1x and 2x
    assert result["rankings"] == {"1": ["qknorm", "postnorm"], "2": ["qknorm", "postnorm"]}
    assert result["hold_at_every_lr"] == [["qknorm", "postnorm"]]
    assert "- Orderings that hold at every learning rate: qknorm > postnorm" in text
    # the last checkpoint: not decoded in these records; the best is the last where the last validation is best
    assert result["runs"]["qknorm"]["last_source"] == "best"
    assert result["runs"]["postnorm"]["curve"][1] == {"updates": 20, "wall_s": 20, "bleu": 2.0}
    assert "Command: `bash scripts/study.sh`" in text and "Settings: configs/studies/gl-en.yaml;" in text
    assert "published" not in text  # the papers' split differs: no published columns
    png = os.path.join(where.results, "dev_bleu.png")
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_report_names_a_missing_record(tmp_path):
    cfg = config.load(CONFIG)
    where, records_dir, _, _ = _records(tmp_path, {"postnorm": (600, [1.0, 2.0], 0.5)})
    chosen = config.runs(cfg, ["postnorm", "qknorm"], seeds=1, multipliers=False)
    with pytest.raises(StudyError, match=r"no record of qknorm in .*runs/gl-en/: finish them first"):
        report.write(cfg, chosen, where, records_dir)


def test_lr_conclusions_keep_only_orderings_that_hold_at_both():
    rows = [{"system": s, "by_lr": {1.0: {"test": a}, 2.0: {"test": b}}}
            for s, a, b in (("a", 10, 9), ("b", 9, 10), ("c", 8, 7), ("d", 8, 7))]
    rankings, hold = report.lr_conclusions(rows)
    assert rankings == {1.0: ["a", "b", "c", "d"], 2.0: ["b", "a", "c", "d"]}
    # a and b swap; c and d tie at both: no ordering between them
    assert hold == [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")]
