"""The offline demo end to end: `bash scripts/reproduce.sh` with no argument (slow: ~5 min on 2 cores)."""
import json
import os
import subprocess

import pytest

from _eval_tiny import REPO, pipeline_env
from conftest import brute_force_bootstrap_p


@pytest.mark.slow
def test_reproduce_demo_end_to_end_and_resume(tmp_path):
    env = pipeline_env(str(tmp_path))
    cmd = ["bash", os.path.join(REPO, "scripts", "reproduce.sh")]
    first = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "| qknorm |" in first.stdout and "Baseline: postnorm" in first.stdout

    table = json.loads((tmp_path / "results" / "demo" / "compare.json").read_text())
    rows = {r["system"]: r for r in table["rows"]}
    assert set(rows) == {"postnorm", "qknorm"} and table["baseline"] == "postnorm"
    # a learned translation, not a copy or an empty output: the generator's target side reorders
    # and inflects, so copying the source scores near 0
    assert rows["postnorm"]["multi_bleu"] > 50 and rows["qknorm"]["multi_bleu"] > 50
    # the p-value against an independent, slow paired bootstrap (other resamples: sampling error)
    ref = (tmp_path / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines()
    hyps = {s: (tmp_path / "results" / "demo" / s / "hyp.txt").read_text().splitlines() for s in rows}
    expected = brute_force_bootstrap_p(ref, hyps["postnorm"], hyps["qknorm"])
    assert rows["postnorm"]["p_value"] is None and abs(rows["qknorm"]["p_value"] - expected) < 0.06
    for png in ("dev_bleu", "grad_norm", "scales", "attention"):
        assert (tmp_path / "results" / "demo" / f"{png}.png").read_bytes()[:4] == b"\x89PNG", png
    hyp = (tmp_path / "results" / "demo" / "qknorm" / "hyp.txt").read_text().splitlines()
    assert len(hyp) == len((tmp_path / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines())

    # re-running resumes: every stage sees its finished output and the table is unchanged
    again = subprocess.run(cmd, env=env, capture_output=True, text=True)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already trained" in again.stderr and "already evaluated" in again.stderr
    assert json.loads((tmp_path / "results" / "demo" / "compare.json").read_text())["rows"] == table["rows"]
