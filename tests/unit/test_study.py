"""The gl->en study (qknorm_pipeline/study.py, scripts/study.sh): wall time and dev-BLEU curves
from fairseq logs across resumptions, the training flags, the report, and a smoke run (slow)."""
import json
import os
import random
import re
import shutil
import subprocess

import pytest
import yaml

from helpers import REPO, pipeline_env
from qknorm_pipeline import recipes, study
from qknorm_pipeline.scoring import compare

CONFIG = os.path.join(REPO, "configs", "studies", "gl-en.yaml")


def _line(stamp, kind, record):
    return f"2026-01-01 {stamp} | INFO | {kind} | {json.dumps({k: str(v) for k, v in record.items()})}\n"


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
    run = study.read_run(str(log))
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
    with pytest.raises(study.StudyError, match="before the first '# DATE COMMAND' line"):
        study.read_run(str(log))
    with pytest.raises(study.StudyError, match="train the run first"):
        study.read_run(str(tmp_path / "none.log"))


def test_record_change():
    """A finished run's record against the command now: same, a raised budget, or what differs."""
    rec = ("study: scripts/train.sh --seed 1 gl-en qknorm --max-update 2000 --lr 7e-4\n"
           "train: python -m qknorm_pipeline.fairseq_train $DATA_BIN/gl-en --max-update 100000 --lr 7e-4 --max-update 2000\n"
           "decode: --beam 4 --remove-bpe '@@ ' --metric multi_bleu_detok --detok moses\n")
    assert study.record_change(rec, rec + "\n") == "same"
    assert study.record_change(rec, rec.replace("2000", "3000")) == "more-updates"
    assert study.record_change(rec, rec.replace("2000", "1000")) == "different: study: ... --max-update '2000' now '1000'"
    assert study.record_change(rec, rec.replace("--beam 4", "--beam 5")) == "different: decode: ... --beam '4' now '5'"
    # a budget raised together with another change is no continuation
    assert study.record_change(rec, rec.replace("2000", "3000").replace("--lr 7e-4 --max", "--lr 1e-3 --max")) \
        == "different: train: ... --lr '7e-4' now '1e-3'"
    assert study.record_change(rec, rec.replace(" --lr 7e-4\n", "\n", 1))== "different: study line has 10 words against 8"
    assert study.record_change(rec.splitlines()[0][7:], rec) == "different: 1 lines against 3 (a record of an older format)"


def test_flags_follow_the_config():
    cfg = study.load(CONFIG)
    n, warmup, every = (cfg["budget"][k] for k in ("max_update", "warmup_updates", "validate_every"))
    flags = study.train_flags(cfg, "qknorm")
    value = {flags[i]: flags[i + 1] for i in range(0, len(flags), 2)}
    assert value["--max-update"] == str(n) and value["--warmup-updates"] == str(warmup)
    assert value["--validate-interval-updates"] == value["--save-interval-updates"] == str(every)
    # TwT's peak for the study's d with the recipe's own warmup of 8,000 (the gl-en recipe's lambda = 1),
    # reached after the study's short warmup
    assert float(value["--lr"]) == pytest.approx(256 ** -0.5 * 8000 ** -0.5, rel=1e-5)
    assert json.loads(value["--eval-bleu-args"]) == {"beam": 1, "max_len_a": 1, "max_len_b": 50}
    assert value["--encoder-embed-dim"] == "256" and value["--decoder-layers"] == "3"
    # a smoke budget scales warmup and validation interval with it
    small = study.train_flags(cfg, "qknorm", max_update=20)
    small = {small[i]: small[i + 1] for i in range(0, len(small), 2)}
    assert small["--max-update"] == "20" and small["--warmup-updates"] == str(round(20 * warmup / n))
    assert small["--validate-interval-updates"] == str(round(20 * every / n))
    # the study's own warmup does not move with its budget: raising max_update continues the runs
    cfg["budget"]["max_update"] = 2 * n
    longer = study.train_flags(cfg, "qknorm")
    longer = {longer[i]: longer[i + 1] for i in range(0, len(longer), 2)}
    assert longer["--max-update"] == str(2 * n) and longer["--warmup-updates"] == str(warmup)
    with pytest.raises(study.StudyError, match="not one of the study's systems"):
        study.train_flags(cfg, "dnas")


def test_stock_row_is_plain_fairseq_with_its_own_recipe():
    cfg = study.load(CONFIG)
    args = study.stock_args(cfg, "data-bin/gl-en", "ckpt", seed=2)
    joined = " ".join(args)
    assert "--user-dir" not in args and "translation_qk" not in joined and "--arch transformer " in joined
    value = {args[i]: args[i + 1] for i in range(1, len(args) - 1) if args[i].startswith("--")}
    assert value["--adam-betas"] == "(0.9, 0.98)" and value["--lr-scheduler"] == "inverse_sqrt"
    assert float(value["--lr"]) == 5e-4 and value["--dropout"] == "0.3" and float(value["--weight-decay"]) == 1e-4
    assert value["--label-smoothing"] == "0.1" and value["--seed"] == "2"
    assert value["--warmup-updates"] == study.train_flags(cfg, "postnorm")[
        study.train_flags(cfg, "postnorm").index("--warmup-updates") + 1]
    assert value["--max-update"] == str(cfg["budget"]["max_update"])
    assert value["--eval-bleu-remove-bpe"] == recipes.remove_bpe(recipes.load("gl-en"))


def _write_runs(log_dir, walls):
    """train.log of each run: one segment of WALL seconds, validations at 10 and 20 updates."""
    for run, (wall, bleus) in walls.items():
        d = log_dir / "gl-en" / run
        d.mkdir(parents=True)
        end = f"12:{wall // 60:02d}:{wall % 60:02d}"
        d.joinpath("train.log").write_text(
            "# 2026-01-01T12:00:00Z fairseq-train data-bin\n2026-01-01 12:00:00 | INFO | x | start\n"
            + _line("12:00:10", "valid", {"valid_loss": 5, "valid_bleu": bleus[0], "valid_num_updates": 10})
            + _line("12:00:20", "valid", {"valid_loss": 4, "valid_bleu": bleus[1], "valid_num_updates": 20})
            + f"2026-01-01 {end} | INFO | x | done\n")


def _write_scores(results, runs):
    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(20)]
    refs = [" ".join(rng.choice(vocab) for _ in range(10)) for _ in range(40)]
    ref = results / "ref.en"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text("".join(r + "\n" for r in refs))
    for run, noise in runs.items():
        d = results / "gl-en" / run
        d.mkdir(parents=True)
        d.joinpath("hyp.txt").write_text("".join(
            " ".join(w if rng.random() > noise else rng.choice(vocab) for w in r.split()) + "\n" for r in refs))
        d.joinpath("scores.json").write_text(json.dumps({"reference": [str(ref)], "metric": "multi_bleu",
                                                         "detok": "none", "systems": {}}))


def test_report_tables_and_curves(tmp_path):
    cfg = study.load(CONFIG)
    walls = {"postnorm": (600, [1.0, 2.0]), "postnorm_seed2": (900, [1.5, 2.5]),
             "fairseq_transformer": (1200, [0.5, 1.0]), "fairseq_transformer_seed2": (1260, [0.7, 1.1])}
    _write_runs(tmp_path / "logs", walls)
    _write_scores(tmp_path / "results", {r: 0.3 + i / 20 for i, r in enumerate(walls)})
    table = compare.build("gl-en", str(tmp_path / "results"), n_samples=50)
    compare.write(table, str(tmp_path / "results"))
    md, png = study.report(cfg, str(tmp_path / "logs"), str(tmp_path / "results" / "gl-en" / "compare.json"),
                           str(tmp_path / "out"), command="bash scripts/study.sh", systems=["postnorm",
                           "fairseq_transformer"], seeds=2)
    text = open(md).read()
    # wall time per run: postnorm 10 and 15 min (mean 12.5, sd 3.54), stock 20 and 21 min
    assert "| postnorm | 20 20 | 12.5 ± 3.5 (10.0, 15.0) | 25.0 | 2.25 ± 0.35 (2.00, 2.50) |" in text
    assert "| fairseq_transformer | 20 20 | 20.5 ± 0.7 (20.0, 21.0) | 41.0 | 1.05 ± 0.07 (1.00, 1.10) |" in text
    assert "Total training time: 66.0 min" in text
    rows = {r["system"]: r for r in table["rows"]}
    p = rows["postnorm"]
    assert f"| postnorm | {p['multi_bleu']:.2f} ± {p['multi_bleu_sd']:.2f} |" in text
    assert "Command: `bash scripts/study.sh`" in text and "Settings: configs/studies/gl-en.yaml;" in text
    assert "published" not in text  # the papers' split differs: no published columns
    assert "mean over seeds ± sample standard deviation; p from the replicate bootstrap" in text
    res = json.load(open(tmp_path / "out" / "study.json"))
    assert res["runs"]["postnorm"]["2"]["curve"][1] == {"updates": 20, "wall_s": 20, "bleu": 2.5}
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(study.StudyError, match="evaluate the runs first"):
        study.report(cfg, str(tmp_path / "logs"), str(tmp_path / "none.json"), str(tmp_path / "out"))


def test_report_of_one_seed_claims_no_spread(tmp_path):
    cfg = study.load(CONFIG)
    _write_runs(tmp_path / "logs", {"postnorm": (600, [1.0, 2.0]), "fairseq_transformer": (1200, [0.5, 1.0])})
    _write_scores(tmp_path / "results", {"postnorm": 0.3, "fairseq_transformer": 0.4})
    compare.write(compare.build("gl-en", str(tmp_path / "results"), n_samples=50), str(tmp_path / "results"))
    md, _ = study.report(cfg, str(tmp_path / "logs"), str(tmp_path / "results" / "gl-en" / "compare.json"),
                         str(tmp_path / "out"), systems=["postnorm", "fairseq_transformer"], seeds=1)
    text = open(md).read()
    assert "one run per system, no spread; p from the paired bootstrap" in text
    assert "±" not in text and "mean over seeds" not in text


def _smoke_study(tmp_path, **overrides):
    """A study config over a small generated gl-en corpus and a tiny model, 1 seed; (config, env)."""
    src = tmp_path / "corpus"
    src.mkdir()
    rng = random.Random(5)
    words = [f"pal{i}" for i in range(40)]
    for split, n in (("train", 600), ("dev", 30), ("test", 30)):
        sents = [[rng.choice(words) for _ in range(rng.randint(3, 9))] for _ in range(n)]
        (src / f"{split}.gl").write_text("".join(" ".join(s) + "\n" for s in sents))
        (src / f"{split}.en").write_text("".join(" ".join("w" + w[3:] for w in reversed(s)) + "\n" for s in sents))
    cfg = yaml.safe_load(open(CONFIG))
    cfg.update(source_dir=str(src), seeds=1, model={"embed_dim": 32, "ffn_dim": 64, "layers": 1, "heads": 2},
               **overrides)
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, pipeline_env(str(tmp_path))


@pytest.mark.system
def test_study_smoke_run(tmp_path):
    """scripts/study.sh end to end with 20 updates, 1 seed, two of our systems and the stock row, on a
    small generated gl-en corpus and a tiny model: the table, the curves, and a plain-fairseq stock run."""
    config, env = _smoke_study(tmp_path)
    cmd = ["bash", os.path.join(REPO, "scripts", "study.sh"), "--config", str(config), "--systems",
           "postnorm qknorm fairseq_transformer", "--max-update", "20"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # one stage line per run, then the progress display's summary (the stock row's too)
    assert re.search(r"\[study [\d:]+\] run 3/3 fairseq_transformer\n", p.stderr), p.stderr[-3000:]
    assert re.search(r"\[train [\d:]+\] gl-en/fairseq_transformer: 20 updates in ", p.stderr), p.stderr[-3000:]
    out = tmp_path / "results" / "study-gl-en-u20"
    text = (out / "study.md").read_text()
    for system in ("postnorm", "qknorm", "fairseq_transformer"):
        assert f"| {system} | " in text
    with open(out / "dev_bleu.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    res = json.loads((out / "study.json").read_text())
    stock_cmd = res["runs"]["fairseq_transformer"]["1"]["commands"][0]
    assert stock_cmd.startswith("fairseq-train ") and "--user-dir" not in stock_cmd
    assert "--user-dir" in res["runs"]["qknorm"]["1"]["commands"][0]
    assert all(r["1"]["updates"] == 20 for r in res["runs"].values())
    # a second call finds every run's record and only rebuilds the report
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count(": finished, record ") == 3 and "training gl-en/" not in again.stderr
    # a fresh clone: checkpoints, logs, data and test outputs gone, only the committed records left
    records = out / "runs" / "gl-en"
    assert sorted(p.name for p in records.iterdir() if p.is_dir()) == ["fairseq_transformer", "postnorm", "qknorm"]
    assert {p.name for p in (records / "qknorm").iterdir()} == {"train.log", "hyp.txt", "scores.json", "command.txt"}
    # how each run was made, without this machine's paths: the study's command, the whole training
    # command (the study's folders by name, no device flag) and the decoding settings
    study_line, train_line, decode_line = (records / "qknorm" / "command.txt").read_text().splitlines()
    assert study_line.startswith("study: scripts/train.sh --seed 1 gl-en qknorm ")
    assert train_line.startswith("train: python -m qknorm_pipeline.fairseq_train $DATA_BIN/gl-en --user-dir qknorm_fairseq ")
    assert "--save-dir $CKPT_DIR/gl-en/qknorm " in train_line and "--cpu" not in train_line
    assert decode_line.startswith("decode: ") and "--beam 4 " in decode_line
    assert (records / "fairseq_transformer" / "command.txt").read_text().startswith(
        "study: fairseq-train '$DATA_BIN/gl-en' ")
    assert str(tmp_path) not in "".join((records / r / "command.txt").read_text()
                                        for r in ("qknorm", "fairseq_transformer"))
    for gone in ("checkpoints", "logs", "data", "data-bin", "results/study-gl-en-u20/gl-en"):
        shutil.rmtree(tmp_path / gone)
    fresh = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.stderr.count(": finished, record ") == 3 and "training gl-en/" not in fresh.stderr
    assert json.loads((out / "study.json").read_text())["runs"] == res["runs"]
    assert (out / "study.md").read_text().split("## Test BLEU")[1] == text.split("## Test BLEU")[1]
    # a report of seeds not all finished names the missing run
    seeds2 = subprocess.run(cmd + ["--report-only", "--seeds", "2"], env=env, capture_output=True, text=True)
    assert seeds2.returncode == 1
    assert "no record of postnorm_seed2 in results/study-gl-en-u20/runs/gl-en/: finish it first" \
        in seeds2.stderr.replace(str(tmp_path) + "/", ""), seeds2.stderr[-2000:]
    # a record made by another command (here its decoding) is never overwritten: the dry run says
    # so, the study stops, and the record is left as it was
    rec = records / "postnorm" / "command.txt"
    rec.write_text(rec.read_text().replace("--beam 4 ", "--beam 5 "))
    dry = subprocess.run(cmd + ["--dry-run"], env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "== postnorm: different: decode: ... --beam '5' now '4'\nstudy: " in dry.stdout
    assert "== qknorm: same\n" in dry.stdout and "training gl-en/" not in dry.stderr
    before = rec.read_text()
    other = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert other.returncode == 1
    assert ("run 1/3 postnorm: its record results/study-gl-en-u20/runs/gl-en/postnorm/ was made by another "
            "command (decode: ... --beam '5' now '4'); move the record away (and "
            "checkpoints/study-gl-en-u20/gl-en/postnorm/, to start from scratch) to train postnorm again") \
        in other.stderr.replace(str(tmp_path) + "/", ""), other.stderr[-2000:]
    assert rec.read_text() == before


@pytest.mark.system
def test_raising_the_budget_continues_every_run(tmp_path):
    """The config's max_update raised after the study finished: every run (ours and the stock row)
    resumes from its last checkpoint with the same warmup and goes on to the new budget."""
    config, env = _smoke_study(tmp_path, budget={"max_update": 12, "warmup_updates": 4, "validate_every": 6})
    cmd = ["bash", os.path.join(REPO, "scripts", "study.sh"), "--config", str(config), "--systems",
           "postnorm fairseq_transformer"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    cfg = yaml.safe_load(config.read_text())
    cfg["budget"]["max_update"] = 18
    config.write_text(yaml.safe_dump(cfg))
    second = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "already trained" not in second.stderr
    assert second.stderr.count(": continuing its finished run to 18 updates") == 2, second.stderr[-3000:]
    res = json.loads((tmp_path / "results" / "study-gl-en" / "study.json").read_text())
    for system in ("postnorm", "fairseq_transformer"):
        run = res["runs"][system]["1"]
        assert run["updates"] == 18 and run["segments"] == 2, run
        assert [p["updates"] for p in run["curve"]] == [6, 12, 18], run["curve"]
        assert all("--warmup-updates 4 " in c and f"--max-update {n} " in c
                   for c, n in zip(run["commands"], (12, 18))), run["commands"]
        log = (tmp_path / "logs" / "study-gl-en" / "gl-en" / system / "train.log").read_text()
        assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ 12 updates\)", log), system
