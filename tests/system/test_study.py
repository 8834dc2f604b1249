"""scripts/study.sh end to end on a small generated gl-en corpus and a tiny model (minutes)."""
import json
import os
import random
import re
import shlex
import shutil
import subprocess

import yaml

from helpers import REPO, environment

CONFIG = os.path.join(REPO, "configs", "studies", "gl-en.yaml")


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
    cfg.update(corpus={"dir": str(src)}, model={"embed_dim": 32, "ffn_dim": 64, "layers": 1, "heads": 2},
               lr_multipliers=[], **overrides)
    config = tmp_path / "study.yaml"
    config.write_text(yaml.safe_dump(cfg))
    return config, environment(tmp_path)


def test_study_smoke_run(tmp_path):
    """scripts/study.sh end to end with 20 updates, 1 seed, two of our systems and the stock row, on a
    small generated gl-en corpus and a tiny model: the table, the curves, and a plain-fairseq stock run."""
    config, env = _smoke_study(tmp_path)
    cmd = ["bash", os.path.join(REPO, "scripts", "study.sh"), "--config", str(config), "--systems",
           "postnorm qknorm fairseq_transformer", "--seeds", "1", "--max-update", "20"]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    # one stage line per run, then the progress display's summary (the stock row's too)
    assert re.search(r"\[study [\d:]+\] run 3/3 fairseq_transformer\n", p.stderr), p.stderr[-3000:]
    assert re.search(r"\[train [\d:]+\] gl-en/fairseq_transformer: 20 updates in ", p.stderr), p.stderr[-3000:]
    out = tmp_path / "results" / "study-gl-en-u20"
    text = (out / "study.md").read_text()
    for system in ("postnorm", "qknorm", "fairseq_transformer"):
        assert f"| {system} | " in text
    # the command that rebuilds this report, and what it lacks of the study (14 runs: 6 systems, 2 or 3 seeds)
    rebuild = (f"bash scripts/study.sh --config {shlex.quote(str(config))} --max-update 20 --report-only "
               "--runs 'postnorm qknorm fairseq_transformer'")
    assert f"Command: `{rebuild}`" in text
    assert "\nRuns: 3 of the study's 14; not in this report: prenorm, scalenorm, fairseq_prenorm, postnorm_seed2, " in text
    with open(out / "dev_bleu.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    res = json.loads((out / "study.json").read_text())
    stock_cmd = res["runs"]["fairseq_transformer"]["commands"][0]
    assert stock_cmd.startswith("fairseq-train ") and "--user-dir" not in stock_cmd
    assert "--user-dir" in res["runs"]["qknorm"]["commands"][0]
    assert all(r["updates"] == 20 for r in res["runs"].values())
    # a second call finds every run's record and only rebuilds the report
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert again.stderr.count(": finished, record ") == 3 and "training gl-en/" not in again.stderr
    # a call that trains one run (--runs) reports every recorded run, not that one only
    one = subprocess.run(cmd + ["--runs", "qknorm"], env=env, capture_output=True, text=True)
    assert one.returncode == 0 and one.stderr.count(": finished, record ") == 1, one.stderr[-3000:]
    assert f"Command: `{rebuild}`" in (out / "study.md").read_text() and "| postnorm | " in (out / "study.md").read_text()
    # the report's own command rebuilds it
    rebuilt = subprocess.run(shlex.split(rebuild.replace("scripts/", REPO + "/scripts/", 1)), env=env,
                             capture_output=True, text=True)
    assert rebuilt.returncode == 0, rebuilt.stderr[-3000:]
    assert (out / "study.md").read_text().split("## Test BLEU")[1] == text.split("## Test BLEU")[1]
    # a fresh clone: checkpoints, logs, data and test outputs gone, only the committed records left
    records = out / "runs" / "gl-en"
    assert sorted(p.name for p in records.iterdir() if p.is_dir()) == ["fairseq_transformer", "postnorm", "qknorm"]
    assert {p.name for p in (records / "qknorm").iterdir()} == {"train.log", "hyp.txt", "scores.json", "command.txt",
                                                                 "last"}
    assert {p.name for p in (records / "qknorm" / "last").iterdir()} == {"hyp.txt", "scores.json"}
    # how each run was made, without this machine's paths: the whole training command (the study's
    # folders by name, no device flag) and the decoding settings
    train_line, decode_line = (records / "qknorm" / "command.txt").read_text().splitlines()
    assert train_line.startswith("train: python -m qknorm_pipeline.fairseq_train '$DATA_BIN/gl-en' --user-dir "
                                 "qknorm_fairseq "), train_line
    assert "--save-dir '$CKPT_DIR/gl-en/qknorm' " in train_line and "--cpu" not in train_line
    assert "--seed 1 " in train_line and "--positions" not in train_line
    assert decode_line.startswith("decode: ") and "--beam 4 " in decode_line
    assert (records / "fairseq_transformer" / "command.txt").read_text().startswith(
        "train: fairseq-train '$DATA_BIN/gl-en' ")
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
    assert seeds2.returncode == 2
    assert ("no record of postnorm_seed2, qknorm_seed2, fairseq_transformer_seed2 in "
            "results/study-gl-en-u20/runs/gl-en/: finish them first") \
        in seeds2.stderr.replace(str(tmp_path) + "/", ""), seeds2.stderr[-2000:]
    # a record made by another command (here its decoding) is never overwritten: the dry run says
    # so, the study stops, and the record is left as it was
    rec = records / "postnorm" / "command.txt"
    rec.write_text(rec.read_text().replace("--beam 4 ", "--beam 5 "))
    dry = subprocess.run(cmd + ["--dry-run"], env=env, capture_output=True, text=True)
    assert dry.returncode == 0, dry.stderr[-2000:]
    assert "== postnorm: different: decode: ... --beam '5' now '4'\ntrain: " in dry.stdout
    assert "== qknorm: same\n" in dry.stdout and "training gl-en/" not in dry.stderr
    before = rec.read_text()
    other = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert other.returncode == 1
    assert ("run 1/3 postnorm: its record results/study-gl-en-u20/runs/gl-en/postnorm/ was made by another "
            "command (decode: ... --beam '5' now '4'); move the record away (and "
            "checkpoints/study-gl-en-u20/gl-en/postnorm/, to start from scratch) to train postnorm again") \
        in other.stderr.replace(str(tmp_path) + "/", ""), other.stderr[-2000:]
    assert rec.read_text() == before


def test_raising_the_budget_continues_every_run(tmp_path):
    """The config's max_update raised after the study finished: every run (ours and the stock row)
    resumes from its last checkpoint with the same warmup and goes on to the new budget."""
    config, env = _smoke_study(tmp_path, budget={"max_update": 12, "warmup_updates": 4, "validate_every": 6})
    cmd = ["bash", os.path.join(REPO, "scripts", "study.sh"), "--config", str(config), "--systems",
           "postnorm fairseq_transformer", "--seeds", "1"]
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
        run = res["runs"][system]
        assert run["updates"] == 18 and run["segments"] == 2, run
        assert [p["updates"] for p in run["curve"]] == [6, 12, 18], run["curve"]
        assert all("--warmup-updates 4 " in c and f"--max-update {n} " in c
                   for c, n in zip(run["commands"], (12, 18))), run["commands"]
        log = (tmp_path / "logs" / "study-gl-en" / "gl-en" / system / "train.log").read_text()
        assert re.search(r"Loaded checkpoint \S+checkpoint_last\.pt \(epoch \d+ @ 12 updates\)", log), system
