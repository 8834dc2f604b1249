"""The offline demo end to end: `bash scripts/reproduce.sh` with no argument (slow: ~5 min on 2 cores),
its table checked against the one recorded for the CPU class it runs on."""
import json
import os
import re
import subprocess

from helpers import REPO, brute_force_bootstrap_p, environment


def test_reproduce_demo_end_to_end_and_resume(tmp_path):
    # as a user runs it: the demo's config pins its threads (conftest's one-thread default would win
    # over them); a passive OpenMP wait keeps its two threads from spinning against another test's
    env = {k: v for k, v in environment(tmp_path, OMP_WAIT_POLICY="PASSIVE").items()
           if k not in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")}
    cmd = ["bash", os.path.join(REPO, "scripts", "reproduce.sh")]
    # what a user sees, captured as a non-terminal (CI, nohup, | tee): stdout and stderr in one stream
    first = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = first.stdout
    assert first.returncode == 0, seen[-3000:]
    assert_readable_transcript(seen)

    table = json.loads((tmp_path / "results" / "demo" / "compare.json").read_text())
    rows = {r["system"]: r for r in table["rows"]}
    assert set(rows) == {"postnorm", "qknorm"} and table["baseline"] == "postnorm"
    # a learned translation, not a copy or an empty output: the generator's target side reorders
    # and inflects, so copying the source scores near 0
    assert rows["postnorm"]["multi_bleu"] > 50 and rows["qknorm"]["multi_bleu"] > 50
    # the p-value against an independent, slow paired bootstrap (other resamples: sampling error)
    ref = (tmp_path / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines()
    hyps = {s: (tmp_path / "results" / "demo" / s / "hyp.txt").read_text().splitlines() for s in rows}
    one_sided = brute_force_bootstrap_p(ref, hyps["postnorm"], hyps["qknorm"])
    expected = 2 * min(one_sided, 1 - one_sided)  # the table's p is two-sided
    assert rows["postnorm"]["p_value"] is None and abs(rows["qknorm"]["p_value"] - expected) < 0.06
    for png in ("dev_bleu", "grad_norm", "scales", "attention"):
        assert (tmp_path / "results" / "demo" / f"{png}.png").read_bytes()[:4] == b"\x89PNG", png
    assert_table_of_this_machine_class({s: r["multi_bleu"] for s, r in rows.items()})
    hyp = (tmp_path / "results" / "demo" / "qknorm" / "hyp.txt").read_text().splitlines()
    assert len(hyp) == len((tmp_path / "data" / "demo" / "tok" / "test.tgt").read_text().splitlines())

    # re-running resumes: every stage sees its finished output and the table is unchanged
    again = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert again.returncode == 0, again.stdout[-3000:]
    assert "already trained" in again.stdout and "already evaluated" in again.stdout
    assert len(again.stdout.splitlines()) < len(seen.splitlines()) and "| qknorm |" in again.stdout
    assert json.loads((tmp_path / "results" / "demo" / "compare.json").read_text())["rows"] == table["rows"]


def cpu_vendor_and_flags():
    vendor, flags = None, set()
    with open("/proc/cpuinfo", encoding="utf-8") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key.strip() == "vendor_id" and vendor is None:
                vendor = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    return vendor, flags


def assert_table_of_this_machine_class(scores):
    """The demo's scores against the table recorded for this CPU class (results/demo/by_machine.json):
    AMD EPYCs print the committed results/demo/compare.json; an Intel Xeon with AMX its own table.
    Other machines print a table no one has recorded yet, so only its structure is checked."""
    known = json.loads(open(os.path.join(REPO, "results", "demo", "by_machine.json"), encoding="utf-8").read())
    vendor, flags = cpu_vendor_and_flags() if os.path.exists("/proc/cpuinfo") else (None, set())
    for cls in known["classes"]:
        if cls["vendor"] == vendor and set(cls.get("cpu_flags", [])) <= flags:
            if "table" in cls:
                committed = json.loads(open(os.path.join(REPO, cls["table"]), encoding="utf-8").read())
                expected = {r["system"]: round(r["multi_bleu"], 2) for r in committed["rows"]}
            else:
                expected = cls["multi_bleu"]
            assert {s: round(v, 2) for s, v in scores.items()} == expected, (cls["class"], scores, expected)
            return
    print(f"no demo table recorded for CPU vendor {vendor}; results/demo/by_machine.json lists the classes")


def assert_readable_transcript(seen):
    lines = seen.splitlines()
    assert len(lines) <= 60, f"{len(lines)} lines:\n{seen}"
    # one line per stage: what, where, how long
    for pattern in (r"^\[reproduce [\d:]+\] demo: systems postnorm qknorm; logs in \S+, results in \S+$",
                    r"^\[reproduce [\d:]+\] data: \S+ ready in \d+ s \(log \S+data\.log\)$",
                    r"^\[train [\d:]+\] training demo/postnorm \(postnorm\) on CPU \(fp32\); log \S+train\.log",
                    r"^\[train [\d:]+\] demo/qknorm: 600 updates in \d+:\d\d, loss [\d.]+, best dev BLEU [\d.]+",
                    r"^\[evaluate [\d:]+\] decoding demo/qknorm: 300 test sentences with \S+checkpoint_best\.pt",
                    r"^\[evaluate [\d:]+\] demo/postnorm: decoded 300/300 sentences in \d+:\d\d",
                    r"^\[evaluate [\d:]+\] demo/qknorm: test multi_bleu [\d.]+ \(detok none\)",
                    r"^\[reproduce [\d:]+\] plots: \S+\{dev_bleu,grad_norm,scales,attention\}\.png in \d+ s",
                    r"^\[reproduce [\d:]+\] demo: finished in \d+ s; table \S+compare\.md$"):
        assert re.search(pattern, seen, re.M), f"no line like {pattern!r} in:\n{seen}"
    # live progress as plain lines: one per validation (every 100 updates), with the ETA
    progress = re.findall(r"^\[train [\d:]+\] demo/(\w+) (\d+)/600 updates  loss [\d.]+  dev BLEU [\d.]+  "
                          r"lr [\d.e+-]+  [\d.]+ upd/s  ETA \d+:\d\d$", seen, re.M)
    updates = [int(u) for s, u in progress if s == "qknorm"]
    # a line at every validation; on a slow machine also one every 5 minutes in between
    assert set(range(100, 601, 100)) <= set(updates) and updates == sorted(updates), seen
    # the table as soon as it exists, before the plots (which may fail without losing it)
    assert "| qknorm |" in seen and "Baseline: postnorm" in seen
    assert seen.index("| qknorm |") < seen.index("plots: ")
    # nothing the user cannot act on
    for noise in ("DEBUG", "eprecat", "Warning", "Traceback", "| INFO |", "INFO:"):
        assert noise not in seen, f"{noise!r} in:\n{seen}"
