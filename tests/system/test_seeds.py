"""`reproduce.sh --seeds 2` on the demo: two trainings of one system, its row over both seeds (slow). The
table over seeds of several systems, with its tests, is tests/unit/test_seeds.py's, on fixture results."""
import json
import os
import statistics
import subprocess

import pytest

from helpers import REPO, environment


def test_reproduce_with_two_seeds_on_the_demo(tmp_path):
    env = environment(tmp_path)
    cmd = ["bash", os.path.join(REPO, "scripts", "reproduce.sh"), "demo", "--systems", "qknorm", "--seeds", "2", "--",
           "--max-update", "100"]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    res = tmp_path / "results" / "demo"
    table = json.loads((res / "compare.json").read_text())
    rows = {r["system"]: r for r in table["rows"]}
    assert set(rows) == {"qknorm"}
    for system in rows:
        files = {1: res / system / "scores.json", 2: res / f"{system}_seed2" / "scores.json"}
        scores = {k: json.loads(f.read_text())["systems"] for k, f in files.items()}
        per_seed = [next(iter(scores[k].values()))["multi_bleu"] for k in (1, 2)]
        assert per_seed[0] != per_seed[1], "two seeds gave the same model"
        assert [rows[system]["per_seed"][str(k)]["multi_bleu"] for k in (1, 2)] == pytest.approx(per_seed, abs=1e-3)
        assert rows[system]["multi_bleu"] == pytest.approx(statistics.mean(per_seed), abs=1e-3)
        assert rows[system]["multi_bleu_sd"] == pytest.approx(statistics.stdev(per_seed), abs=1e-3)
        log2 = (tmp_path / "logs" / "demo" / f"{system}_seed2" / "train.log").read_text()
        assert "--seed 2" in log2
    assert "± " in first.stdout
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0 and again.stderr.count("already trained") == 2
