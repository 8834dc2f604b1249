"""Smoke runs of qknorm_pipeline.benchmark (speed, kernels): structure of the outputs, never timings."""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys

import pytest

from qknorm_fairseq.architectures import PRESETS
from qknorm_pipeline.benchmark import speed
from qknorm_pipeline.benchmark.__main__ import main
from qknorm_pipeline.cli import UserError
from qknorm_pipeline.paths import ROOT

TINY = ["--dim", "16", "--layers", "1", "--heads", "2", "--vocab", "30", "--batch", "2", "--src-len", "5",
        "--tgt-len", "4", "--warmup-steps", "1", "--train-steps", "1", "--reps", "1"]


def test_speed_reports_every_preset_against_stock(tmp_path):
    out = tmp_path / "bench"
    main(["speed", *TINY, "--out", str(out)])
    res = json.loads((tmp_path / "bench.json").read_text())
    assert set(res["models"]) == {"transformer", *PRESETS}
    assert res["machine"]["torch"] and res["machine"]["fairseq"] and res["machine"]["cpu_count"] >= 1
    assert res["settings"]["dim"] == 16 and res["settings"]["vocab"] > 30  # 30 words + fairseq's specials
    for arch, r in res["models"].items():
        for metric in speed.METRICS:
            assert len(r[metric]["runs"]) == 1 and r[metric]["median"] > 0, (arch, metric)
        if arch != "transformer":
            for metric in speed.METRICS:
                expected = r[metric]["median"] / res["models"]["transformer"][metric]["median"]
                assert r["ratio"][metric] == pytest.approx(expected)
            assert r["target"] == (0.80 if arch in ("transformer_dnas", "transformer_hnas") else 0.95)
            assert r["meets_target"] == (min(r["ratio"]["train_tok_s"], r["ratio"]["decode_sent_s"]) >= r["target"])
    md = (tmp_path / "bench.md").read_text()
    assert "| transformer_hnas |" in md and "Software: Python" in md


def test_speed_rejects_bad_settings(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["speed", "--dim", "30", "--heads", "4", "--out", str(tmp_path / "b")])
    assert "--dim 30 must be divisible by --heads 4" in capsys.readouterr().err
    assert main(["speed", *TINY, "--archs", "transformer_nope", "--out", str(tmp_path / "b")]) == 2
    assert "[benchmark] error: --archs: unknown preset 'transformer_nope'; choose from qknorm_transformer" in capsys.readouterr().err
    for tool in ("speed", "kernels"):  # their flags after -- were once dropped without a word
        with pytest.raises(SystemExit):
            main([tool, "--out", str(tmp_path / "b"), "--", "--heads", "8"])
        assert f"{tool} takes no flags after --, so '--heads 8' would be ignored: give them before --" in \
            capsys.readouterr().err
    assert not (tmp_path / "b.md").exists()


def test_kernels_table_times_every_kernel_against_its_reference(tmp_path, capsys):
    out = tmp_path / "kern"
    from qknorm_fairseq import native
    from qknorm_fairseq.fused_kernels import has_compiler
    from qknorm_pipeline.benchmark import kernels

    compiler = has_compiler()  # --fused-kernels' rows need one
    times = kernels.run(argparse.Namespace(dim=16, heads=2, tokens=8, vocab=12, p=[2.0, 4.0], iters=2, reps=2,
                                                   out=str(out)))
    names = {name for name, _ in times}
    assert names == {"LayerNorm", "ScaleNorm", "RMSNorm", "vector_norm p=2", "lp_normalize p=2",
                     "vector_norm p=2 bf16", "lp_normalize p=2 bf16",
                     "vector_norm p=4", "lp_normalize p=4",
                     *(f"{k} {t}" for k in ("torch dropout", "fast_dropout, torch's ops", "fast_dropout",
                                             "relu dropout, torch's ops", "relu dropout") for t in ("fp32", "bf16")),
                     "sdpa attention fp32", "matmul attention fp32",
                     "sdpa attention bf16", "matmul attention bf16", "log_softmax loss bf16", "fused loss bf16",
                     *(f"{k} step attention {t}" for k in ("sdpa", "matmul") for t in ("fp32", "bf16")),
                     *([f"step attention loop {t}" for t in ("fp32", "bf16")] if native.compiler() else []),
                     *(["compiled torch dropout bf16", "fused_kernels loss bf16, compiled", "fused_kernels loss bf16",
                        "fused_kernels lp_normalize p=2 bf16, compiled",
                        "fused_kernels lp_normalize p=2 bf16"]
                       if compiler else []),
                     *(["fused_kernels lp_normalize p=2 bf16, portable C"] if compiler and native.compiler() else []),
                     *(["softmax dropout, torch's ops bf16", "softmax dropout bf16", "layer norm loop bf16",
                        *(f"{k} bf16, portable C" for k in ("softmax dropout", "fast_dropout", "relu dropout",
                                                             "layer norm loop")),
                        "linear bf16", "linear bf16, torch's weight gradient"] if native.compiler() else [])}
    assert all(len(v) == 2 and min(v) > 0 for v in times.values())
    assert not any(grad for name, grad in times if "step attention" in name)  # decoding: no backward
    md = out.with_suffix(".md").read_text()
    assert md in capsys.readouterr().out
    row = next(line for line in md.splitlines() if line.startswith("| matmul step attention bf16 |")).split(" | ")
    assert row[3:5] == ["", ""] and row[-1] == "sdpa step attention bf16 |"
    row = next(line for line in md.splitlines() if line.startswith("| lp_normalize p=4 |")).split(" | ")
    assert row[-1] == "vector_norm p=4 |"
    ratio = statistics.median(times["lp_normalize p=4", True]) / statistics.median(times["vector_norm p=4", True])
    assert row[4] == f"{ratio:.2f}"
    if native.compiler():  # the C loops' portable builds, each against the machine's
        row = next(line for line in md.splitlines() if line.startswith("| softmax dropout bf16, portable C |"))
        assert row.endswith("| softmax dropout bf16 |")
        row = next(line for line in md.splitlines() if line.startswith("| linear bf16, torch's weight gradient |"))
        assert row.endswith("| linear bf16 |")


def test_command_line_exits_0_with_its_table(tmp_path):
    # `python -m qknorm_pipeline.benchmark` as scripts/benchmark.sh runs it: the table on stdout, status 0
    p = subprocess.run([sys.executable, "-m", "qknorm_pipeline.benchmark", "kernels", "--dim", "8", "--heads", "2",
                        "--tokens", "4", "--p", "2", "--iters", "1", "--reps", "1", "--out", str(tmp_path / "k")],
                       capture_output=True, text=True, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == (tmp_path / "k.md").read_text().strip() and "| lp_normalize p=2 |" in p.stdout


def test_step_flops_and_mfu(tmp_path):
    # A training step's matrix FLOPs are at least 3 x 2 x (tokens x params of every Linear) for the
    # forward, input-gradient and weight-gradient products; MFU is TFLOP/s over the given peak.
    out = tmp_path / "bench"
    main(["speed", *TINY, "--archs", "transformer_qknorm", "--peak-tflops", "2.0", "--out", str(out)])
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["peak_tflops"] == 2.0
    for r in res["models"].values():
        assert r["mfu"] == pytest.approx(r["train_tflops"] / 2.0)
    import argparse

    import torch

    opts = argparse.Namespace(dim=16, layers=1, heads=2, ffn=None, dropout=0.1, stock_dropout=None, src_len=5, device="cpu", dtype="fp32")
    entry = speed.build(speed.make_corpus(str(tmp_path / "c"), 30, 5), "transformer", opts)
    sample = speed.make_batch(entry["task"], 2, 5, 4, "cpu", seed=1)
    linear = sum(m.weight.numel() for m in entry["model"].modules() if isinstance(m, torch.nn.Linear))
    assert speed.step_flops(entry, sample, opts) >= 6 * linear * 2 * 4  # >= decoder-side products alone
    assert speed.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert speed.peak_tflops("Some CPU", "fp32") is None


def test_results_name_no_machine_paths(tmp_path, monkeypatch):
    from qknorm_pipeline.paths import shareable

    assert shareable(f"{ROOT}/results/x") == "results/x" and shareable("/elsewhere/x") == "/elsewhere/x"
    out = os.path.join(ROOT, "results", f"bench-test-{os.getpid()}")
    monkeypatch.setattr("sys.argv", ["benchmark", "speed", "--out", out])
    try:
        main(["speed", *TINY, "--archs", "transformer_qknorm", "--out", out])
        res = json.loads(open(out + ".json").read())
    finally:
        for suffix in (".json", ".md"):
            if os.path.exists(out + suffix):
                os.remove(out + suffix)
    assert "hostname" not in res["machine"] and ROOT not in res["command"]
    # and nothing committed under results/ names this machine's folders
    tracked = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True, text=True).stdout.split()
    for f in tracked:
        if f.endswith((".json", ".md", ".csv")):
            text = open(os.path.join(ROOT, f), encoding="utf-8").read()
            assert ROOT not in text and '"hostname"' not in text, f
            assert not re.search(r"(?<![\w.])/(home|root|work|tmp|Users|mnt|scratch|data)/", text), f


def test_stock_dropout_replaces_dropout_for_the_stock_model_only():
    opts = argparse.Namespace(dim=16, ffn=None, layers=1, heads=2, dropout=0.4, stock_dropout=[0.3, 0.0, 0.0])
    flags = [str(f) for f in speed.model_flags(opts, speed.STOCK)]
    assert [flags[flags.index(f) + 1] for f in ("--dropout", "--attention-dropout", "--activation-dropout")] == [
        "0.3", "0.0", "0.0"]
    assert speed.dropouts(opts, "transformer_qknorm") == (0.4, 0.4, 0.4)
    assert speed.dropouts(argparse.Namespace(dropout=0.1, stock_dropout=None), speed.STOCK) == (0.1, 0.1, 0.1)


def _fake_fairseq(tmp_path, last_update, die):
    """A command that logs train_inner records up to LAST_UPDATE (ups = update / 10; epoch 1 up to update
    3, then epoch 2), then exits or aborts."""
    code = ("import json, os\n"
            f"for u in range(1, {last_update} + 1):\n"
            "    print('INFO | train_inner | ' + json.dumps({'epoch': 1 + (u > 3), 'loss': '5.0', 'num_updates': str(u), "
            "'ups': str(u / 10)}), flush=True)\n"
            + ("os.abort()\n" if die else ""))
    return [sys.executable, "-c", code]


def test_throughput_keeps_a_whole_measurement_whose_process_died_on_exit(tmp_path, capsys):
    from qknorm_pipeline.benchmark import throughput
    from qknorm_pipeline.cli import UserError

    ups, by_epoch = throughput.time_one(_fake_fairseq(tmp_path, 6, die=False), None, 2, 6)
    # after update 2: 0.3 0.4 0.5 0.6; epoch 1 without the first record: 0.2 0.3; epoch 2: 0.4 0.5 0.6
    assert ups == pytest.approx(0.45) and by_epoch == pytest.approx({"1": 0.25, "2": 0.5})
    assert throughput.time_one(_fake_fairseq(tmp_path, 6, die=True), None, 2, 6)[0] == pytest.approx(0.45)
    assert "logged all 6 updates, then died with signal 6 on exit" in capsys.readouterr().err
    with pytest.raises(UserError, match=r"failed \(-6\)"):
        throughput.time_one(_fake_fairseq(tmp_path, 4, die=True), None, 2, 6)  # died before its last update


def test_throughput_stock_row_is_the_stock_recipe_at_the_pair_recipe_size():
    from qknorm_pipeline import recipes
    from qknorm_pipeline.benchmark import throughput

    cfg = recipes.load("gl-en")
    cmd = throughput.stock_command(cfg, "bin", "save", gpu=False, precision="fp32")
    got = {a: cmd[i + 1] for i, a in enumerate(cmd[:-1]) if a.startswith("--") and not cmd[i + 1].startswith("--")}
    for key, value in {**cfg.stock.flags, **cfg.stock.iwslt}.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            assert flag in cmd
        elif key != "max_tokens":
            assert got[flag] == str(value), key
    assert got["--arch"] == recipes.STOCK_ARCH and got["--warmup-updates"] == str(cfg.stock.warmup_updates) == "4000"
    # the model size and batch are the pair recipe's
    assert (got["--encoder-embed-dim"], got["--decoder-ffn-embed-dim"], got["--encoder-layers"]) == (
        str(cfg.model.embed_dim), str(cfg.model.ffn_dim), str(cfg.model.encoder_layers))
    assert got["--max-tokens"] == str(cfg.train.max_tokens) and cmd.count("--max-tokens") == 1
    # started as train.sh starts ours (fairseq-train itself cannot run --bf16 without TPUs), no plugin
    assert "--user-dir" not in cmd and "--cpu" in cmd and cmd[1:3] == ["-m", "qknorm_pipeline.fairseq_train"]
    assert got["--save-dir"] == "save" and got["--seed"] == str(cfg.train.seed)
    bf16 = throughput.stock_command(cfg, "bin", "save", gpu=False, precision="bf16")
    assert bf16[bf16.index("--cpu") + 1] == "--bf16" and "--cpu" not in throughput.stock_command(
        cfg, "bin", "save", gpu=True, precision="bf16")


def test_step_profile_counts_ops_by_phase_and_by_name():
    import torch

    from qknorm_pipeline.benchmark.step_profile import OpCounter, phased

    counter = OpCounter()
    a, b = torch.randn(4, 3), torch.randn(3, 2)
    forward = phased(counter, "forward", lambda: torch.relu(a @ b).sum())
    with counter:
        forward()
        (a + 1).mul(2)
    assert counter.by_name["forward", "mm"] == 1 and counter.by_name["forward", "relu"] == 1
    assert counter.by_name["other", "add"] == 1 and counter.by_name["other", "mul"] == 1
    assert ("forward", "add") not in counter.by_name
    for phase, total in counter.ops.items():
        assert total == sum(n for (p, _), n in counter.by_name.items() if p == phase)


def test_step_profile_splits_an_update_by_op_family_and_counts_regions_whole():
    import time

    import torch
    import torch.nn.functional as F

    from qknorm_pipeline.benchmark.step_profile import COMPILED_EVENT, FAMILIES, FRAMEWORK, op_families, regioned

    x, w = torch.randn(4096, 256), torch.randn(256, 256)  # each op well above 0.1 ms, the rounding
    clip = regioned("clip", lambda: (x @ w).mm(w))  # matrix products inside the clip: the optimizer's time
    draw = regioned("keep_mask", lambda: torch.rand(4096, 256).lt(0.5))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        F.layer_norm(x, (256,)) + 1.0
        clip()
        draw()
        with torch.profiler.record_function(COMPILED_EVENT + " abc ##"):  # as torch.compile names a graph's call
            time.sleep(0.01)
        time.sleep(0.02)  # no ATen op: the framework's share
        wall = (time.perf_counter() - start) * 1e3
    ms = op_families(prof.events(), wall)
    assert set(ms) == {*FAMILIES, "elementwise and copies", "compiled loops", "optimizer and clip", FRAMEWORK}
    assert ms["compiled loops"] >= 10
    assert ms["matrix products"] == 0 and ms["optimizer and clip"] > 0 and ms["dropout"] > 0
    assert ms["norms"] > 0 and ms["elementwise and copies"] > 0 and ms[FRAMEWORK] >= 20
    assert ms["fused attention"] == ms["softmax and loss"] == 0
    assert sum(ms.values()) == pytest.approx(wall, abs=0.1 * len(ms))


def test_step_profile_counts_onednns_linear_as_a_matrix_product():
    """--fused-kernels' bf16 linear layers call oneDNN's linear (an op outside ATen): its time is the
    products', not the framework's."""
    import time

    import torch

    from qknorm_fairseq.fused_kernels import _linear_pointwise
    from qknorm_pipeline.benchmark.step_profile import FRAMEWORK, op_families, time_shares

    linear = _linear_pointwise()
    if linear is None:
        pytest.skip("oneDNN has no bf16 linear on this CPU (or under ONEDNN_MAX_CPU_ISA)")
    x, w, b = torch.randn(4096, 512).bfloat16(), torch.randn(512, 512).bfloat16(), torch.randn(512).bfloat16()
    linear(x, w, b, "none", [], "")  # its kernel built outside the profile
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(5):
            linear(x, w, b, "none", [], "")
        wall = (time.perf_counter() - start) * 1e3
    ms = op_families(prof.events(), wall)
    assert ms["matrix products"] > 0.5 * wall and ms[FRAMEWORK] < 0.5 * wall
    assert "mkldnn::_linear_pointwise" in time_shares(prof)["top_ops"]


def test_step_profile_counts_the_amx_weight_gradients_as_matrix_products(monkeypatch):
    """--fused-kernels' weight gradients in AMX tiles (a C kernel, no ATen op): the products' time, as profiled()
    wraps them."""
    import time

    import torch

    from qknorm_fairseq import fused_kernels
    from qknorm_pipeline.benchmark.step_profile import FRAMEWORK, op_families, regioned

    if fused_kernels._weight_grad_library() is None:
        pytest.skip("no AMX on this CPU (or no C compiler): the weight gradients are torch's mm")
    dy, x = torch.randn(4096, 512).bfloat16(), torch.randn(4096, 512).bfloat16()
    monkeypatch.setattr(fused_kernels, "weight_grad_kernel", regioned("weight_grad_kernel", fused_kernels.weight_grad_kernel))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(5):
            fused_kernels.weight_grads(dy, x)
        wall = (time.perf_counter() - start) * 1e3
    ms = op_families(prof.events(), wall)
    assert ms["matrix products"] > 0.5 * wall and ms[FRAMEWORK] < 0.5 * wall


def test_the_profile_counts_the_update_asked_for_without_logging_it(monkeypatch, tmp_path):
    from qknorm_pipeline.benchmark import throughput

    keys = ("ops", "syncs", "h2d", "sync_sites", "batches_per_epoch", "shapes_per_epoch", "padding", "padding_source",
            "padding_target", "update_ms", "op_ms", "top_ops", "op_families")
    seen = []

    def fake_run(cmd, **kwargs):
        seen.append(cmd)
        with open(cmd[cmd.index("qknorm_pipeline.benchmark.step_profile") + 1], "w") as f:
            json.dump({k: 1 for k in keys}, f)
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(throughput.subprocess, "run", fake_run)
    entry = [sys.executable, "-m", throughput.ENTRY, "bin", "--log-interval", "5"]
    for update, interval in ((6, "1000"), (2000, "2001")):
        rec = throughput.profile_one(entry, None, str(tmp_path), update)
        cmd = seen[-1]
        assert rec == {"profiled_update": update, **{k: 1 for k in keys}}
        assert cmd[cmd.index("--update") + 1] == str(update)
        # fairseq takes a flag's last value: the run stops at UPDATE, and UPDATE does not log
        assert cmd[len(cmd) - 1 - cmd[::-1].index("--max-update") + 1] == str(update)
        assert cmd[len(cmd) - 1 - cmd[::-1].index("--log-interval") + 1] == interval


def test_a_profile_update_below_three_is_refused_before_any_training():
    from qknorm_pipeline.benchmark import throughput

    opts = argparse.Namespace(precisions=["fp32"], out=None, warmup=1, updates=5, profile_update=2)
    with pytest.raises(UserError, match=r"^--profile-update 2: give 3 or more \(its time is the update before it"):
        throughput.run(opts)


def test_the_benchmark_profiles_the_update_asked_for_and_records_it(monkeypatch, tmp_path):
    from qknorm_pipeline.benchmark import throughput

    cmd = [sys.executable, "-m", throughput.ENTRY, "bin"]
    monkeypatch.setattr(throughput, "commands", lambda opts, where, scratch: {("qknorm", "fp32", "system"): (cmd, {})})
    monkeypatch.setattr(throughput, "time_one", lambda cmd, env, warmup, updates: (1.5, {"1": 1.4, "2": 1.6}))
    asked = []

    def profile_one(cmd, env, scratch, update):
        asked.append(update)
        return {"profiled_update": update, "ops": {"total": 1}, "syncs": 0}

    monkeypatch.setattr(throughput, "profile_one", profile_one)
    monkeypatch.setattr(throughput, "table", lambda *args: "")
    out = tmp_path / "records.json"
    opts = argparse.Namespace(precisions=["fp32"], out=str(out), warmup=1, updates=200, profile_update=170,
                              profile=True, reps=1, pair="gl-en", label="x", mallocs=["system"])
    throughput.run(opts)
    assert asked == [170]
    (rec,) = json.loads(out.read_text())
    assert rec["profiled_update"] == 170 and rec["updates_per_s_by_epoch"] == {"1": 1.4, "2": 1.6}
    assert rec["allocator"] == "system" and rec["command"].startswith("ONEDNN_PRIMITIVE_CACHE_CAPACITY=")
    assert " QKNORM_MALLOC=system python -m " in rec["command"]


def test_the_table_compares_each_row_with_stock_under_the_same_allocator():
    from qknorm_pipeline.benchmark import throughput

    speeds = {("qknorm", "bf16", "system"): [2.0], ("fairseq_transformer", "bf16", "system"): [1.0],
              ("qknorm", "bf16", "tcmalloc"): [3.0], ("fairseq_transformer", "bf16", "tcmalloc"): [2.5]}
    table = throughput.table(speeds, {}, 1, {k: [{"1": v[0]}] for k, v in speeds.items()})
    assert "| qknorm | bf16 | system | 2.00 | 2.00 |" in table and "| qknorm | bf16 | tcmalloc | 3.00 | 1.20 |" in table


def test_the_allocators_to_compare_are_resolved_before_measuring(monkeypatch, tmp_path):
    from qknorm_pipeline import allocator
    from qknorm_pipeline.benchmark import throughput

    (tmp_path / "libtcmalloc_minimal.so.4").write_bytes(b"")
    monkeypatch.setattr(allocator, "search_dirs", lambda environ=None: [str(tmp_path)])
    lib = str(tmp_path / "libtcmalloc_minimal.so.4")
    assert throughput.mallocs(["auto", "system", "tcmalloc", lib]) == ["tcmalloc", "system", "tcmalloc", lib]
    with pytest.raises(UserError, match="^QKNORM_MALLOC=jemalloc: no jemalloc library"):
        throughput.mallocs(["jemalloc"])


def test_a_run_under_another_allocator_than_chosen_is_refused():
    from qknorm_pipeline.benchmark import throughput

    cmd, env = ["python", "-m", "qknorm_pipeline.fairseq_train", "bin", "--cpu"], {"QKNORM_MALLOC": "tcmalloc"}
    throughput.check_allocator("x\nmemory allocator: tcmalloc (/usr/lib/libtcmalloc_minimal.so.4)\ny", cmd, env)
    with pytest.raises(UserError, match=r"ran with another allocator than QKNORM_MALLOC=tcmalloc chose: memory "
                                        r"allocator: glibc's malloc; no tcmalloc$"):
        throughput.check_allocator("memory allocator: glibc's malloc; no tcmalloc\nnext", cmd, env)
    throughput.check_allocator("memory allocator: glibc's malloc (QKNORM_MALLOC=system)", cmd, {"QKNORM_MALLOC": "system"})
