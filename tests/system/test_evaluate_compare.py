"""scripts/evaluate.sh and compare.sh on two tiny trained systems, as a user runs them."""
import json
import os

import pytest

from helpers import naive_bleu, script


def test_evaluate_and_compare_scripts_on_tiny_model(tiny_pipeline):
    root = tiny_pipeline
    ref = (root / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines()
    for system in ("postnorm", "prenorm"):
        p = script("evaluate.sh", "demo", system, root=root)
        assert p.returncode == 0, p.stderr[-3000:]
        out = root / "results" / "demo" / system
        hyps = (out / "hyp.txt").read_text().splitlines()
        assert len(hyps) == 40
        scores = json.loads((out / "scores.json").read_text())
        assert scores["systems"][system]["multi_bleu"] == pytest.approx(naive_bleu(hyps, ref), abs=1e-6)
    again = script("evaluate.sh", "demo", "prenorm", root=root)
    assert again.returncode == 0 and "already evaluated" in again.stderr
    p = script("compare.sh", "demo", root=root)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "| prenorm |" in p.stdout
    table = json.loads((root / "results" / "demo" / "compare.json").read_text())
    assert table["baseline"] == "postnorm" and [r["system"] for r in table["rows"]] == ["postnorm", "prenorm"]
    rows = {r["system"]: r for r in table["rows"]}
    assert rows["prenorm"]["delta"] == pytest.approx(rows["prenorm"]["multi_bleu"] - rows["postnorm"]["multi_bleu"],
                                                     abs=1e-3)
    missing = script("evaluate.sh", "demo", "nosuch", root=root)
    assert missing.returncode == 2
    assert missing.stderr.strip().splitlines()[-1].startswith("[evaluate] error:")
    assert "nosuch" in missing.stderr and os.path.isdir(root / "results" / "demo" / "postnorm")
