"""The README's summary numbers against their homes in results/: each table the README shows is
recomputed from the records it summarises, so the two cannot drift apart."""
import json
import os
import re
import statistics

from helpers import REPO


def readme_table(after):
    """The rows (lists of cell texts) of the first markdown table after the line starting AFTER."""
    text = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    start = text.index(after)
    lines = text[start:].splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[first + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def results(path):
    with open(os.path.join(REPO, "results", path), encoding="utf-8") as f:
        return json.load(f)


def number(cell):
    """The first number of a cell ('**13.75** ± 0.27' -> 13.75; '−1.2' -> -1.2)."""
    return float(re.search(r"[−-]?\d+(?:\.\d+)?", cell.replace("*", ""))[0].replace("−", "-"))


def test_demo_table_is_compare_json():
    table = {r["system"]: r for r in results("demo/compare.json")["rows"]}
    rows = readme_table("**The offline demo**")
    assert [r[0] for r in rows] == list(table)
    for system, score, delta, _ in rows:
        assert number(score) == round(table[system]["multi_bleu"], 2)
        if delta:
            assert number(delta) == round(table[system]["multi_bleu"] - table["postnorm"]["multi_bleu"], 2)


# the README's speed rows: the record's file, and which of its systems is ours (the fast path's flags
# on a CPU, the recipe's own on the GPU) and which stock fairseq's
OURS = {"train.sh --fast's bf16 flags, three epochs, AMD EPYC with AVX512-BF16":
            "qknorm:--fast-dropout --fused-loss --attention-kernel matmul --packed-decoder --packed-encoder --fused-kernels "
            "--fused-adam",
        "Intel Xeon without AMX": "qknorm:--fast-dropout --fused-loss --attention-kernel matmul",
        "packed decoder in length groups against one grid, 4 repetitions, AMD EPYC with AVX2 only":
            "qknorm:--fast-dropout --fused-loss --attention-kernel matmul --packed-decoder",
        "a linear layer's weight and bias gradients in one AMX pass, three epochs, Intel Xeon with AMX":
            "qknorm:--fast-dropout --fused-loss --attention-kernel matmul --packed-decoder --packed-encoder --fused-kernels "
            "--fused-adam",
        "the packed encoder, the grids copied by C and the bias inside the product, the gl-en recipe's size, Intel Xeon with AMX":
            "qknorm:--fast-dropout --fused-loss --attention-kernel matmul --packed-decoder --packed-encoder --fused-kernels "
            "--fused-adam",
        "eager (before --compile), cuDNN attention off": "qknorm",
        "H200: fused loss and compile against the recipe and stock": "qknorm"}


def median_speed(records, label, system, precision, malloc):
    # records from before the allocator was recorded ran under glibc's
    speeds = [r["updates_per_s"] for r in records if r["label"] == label and r["system"] == system
              and r["precision"] == precision and r.get("allocator", "system") == malloc]
    assert speeds, (label, system, precision)
    return statistics.median(speeds)


def test_speed_table_is_the_throughput_records():
    rows = readme_table("**Training speed**")
    assert len(rows) == len(OURS)
    for machine, _, precision, ours, stock, ratio, record in rows:
        # one label: both rows ran in one benchmark run; two: ours, then stock's
        where, label, stock_label = re.fullmatch(r'(CPU|GPU): "([^"]+)"(?:, "([^"]+)")?', record).groups()
        records = results("throughput-cpu.json" if where == "CPU" else "gpu/throughput.json")
        stock_label = stock_label or label
        malloc = next((m for m in ("tcmalloc", "jemalloc") if m in machine), "system")
        mine = median_speed(records, label, OURS[label], precision, malloc)
        theirs = median_speed(records, stock_label, "fairseq_transformer", precision, malloc)
        assert number(ours) == round(mine, 2) and number(stock) == round(theirs, 2), (machine, mine, theirs)
        assert number(ratio) == round(mine / theirs, 2), (machine, mine / theirs)
        devices = {r["device"] for r in records if r["label"] == label}
        assert any(word in d for d in devices for word in machine.split()[:2]), (machine, devices)


def mean_sd(pair):
    mean, sd = pair
    return f"{mean:.2f}" if sd is None else f"{mean:.2f} ± {sd:.2f}"


def study_rows(study, after):
    """The README's table of STUDY's report against study.json: systems in the ranking's order, test
    BLEU of the best-dev and last checkpoints over the seeds, each neighbour test's delta, Holm p and
    the smallest delta it resolves."""
    report = results(f"{study}/study.json")
    systems = {s["system"]: s for s in report["systems"]}
    by_lr = {x["system"]: x["by_lr"] for x in report["lr"]}
    rows = readme_table(after)
    tests = report["neighbours"]
    assert [r[0] for r in rows] == [t["pair"][0] for t in tests] + [tests[-1]["pair"][1]]
    for i, row in enumerate(rows):
        s = systems[row[0]]
        assert row[-4 if study == "study-gl-en" else -3] == mean_sd(s["multi_bleu_detok"])
        last = row[-3 if study == "study-gl-en" else -2]
        assert last == ("n/a" if s["last"] is None else mean_sd(s["last"]))
        assert int(row[-5 if study == "study-gl-en" else -4]) == len(s["seeds"])
        expected = "" if i == len(tests) else \
            f'{tests[i]["delta"]:+.2f}, {tests[i]["p_holm_text"]}, {tests[i]["resolvable_delta"]:.2f}'
        assert row[-1] == expected, (row[0], row[-1], expected)
    return rows, by_lr, report


def test_first_study_table_is_its_report():
    rows, by_lr, _ = study_rows("study-gl-en", "*Each system under its own recipe*")
    for row in rows:
        assert number(row[4]) == round(by_lr[row[0]]["2.0"]["test"], 2)


def test_one_recipe_study_table_is_its_report():
    rows, by_lr, report = study_rows("study-gl-en-norm", "*Every system under one recipe*")
    for row in rows:
        # the rate a system is compared at: its best by best dev BLEU, the smaller on a tie
        rates = by_lr[row[0]]
        best = max(rates, key=lambda r: (rates[r]["best_dev"], -float(r)))
        assert float(row[1]) == float(best), (row[0], row[1], best)
    assert report["closed"] and not any(t["resolved"] for t in report["neighbours"])
    levelled = sum(p["levelled_off"] for p in report["plateau"])
    text = " ".join(open(os.path.join(REPO, "README.md"), encoding="utf-8").read().split())
    assert f"only {levelled} of {len(report['plateau'])} runs had levelled off" in text
