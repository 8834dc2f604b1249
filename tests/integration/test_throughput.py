"""`bash scripts/benchmark.sh fairseq-train`: real fairseq-train updates/s of a recipe against stock
fairseq, on the tiny corpus (CPU mode)."""
import json
import shutil
import subprocess
import sys

import pytest

from qknorm_pipeline import allocator
from qknorm_pipeline.fairseq_train import onednn_cache
from qknorm_pipeline.hardware import cpu_has_bf16, cpu_name, machine

from helpers import REPO, TINY_RECIPE, script, train_args


def test_fairseq_train_throughput_appends_one_record_per_system(tiny_data, tmp_path):
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    out = tmp_path / "throughput.json"
    tiny = [f for f in TINY_RECIPE if not f.startswith("{")]
    tiny = tiny[:tiny.index("--eval-bleu-args")]
    argv = ["fairseq-train", "--pair", "demo", "--systems", "postnorm", "postnorm:--fast-dropout --length-buckets 3",
            "fairseq_transformer", "--precisions", "fp32", "--updates", "8", "--warmup", "2", "--log-interval", "1",
            "--label", "test", "--out", str(out), "--", *tiny]
    p = script("benchmark.sh", *argv, root=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert [r["system"] for r in recs] == ["postnorm", "postnorm:--fast-dropout --length-buckets 3",
                                           "fairseq_transformer"]
    for r in recs:
        assert r["updates_per_s"] > 0 and r["device"].startswith(cpu_name()) and r["precision"] == "fp32"
        assert (r["label"], r["pair"], r["updates"], r["warmup"]) == ("test", "demo", 8, 2)
        assert r["ops"]["total"] == sum(r["ops"][k] for k in ("forward", "backward", "clip", "step", "other"))
        assert r["machine"] == machine() and r["op_families"]["matrix products"] > 0
        assert sum(r["op_families"].values()) == pytest.approx(r["update_ms"], abs=1)
        # the padding of both sides together lies between each side's
        sides = sorted((r["padding_source"], r["padding_target"]))
        assert sides[0] <= r["padding"] <= sides[1] and sides[1] > 0
    ours, fast, stock = recs
    # the same data batched by fairseq for ours and stock, by length buckets for the fast row
    epoch = ("batches_per_epoch", "shapes_per_epoch", "padding")
    assert [ours[k] for k in epoch] == [stock[k] for k in epoch] != [fast[k] for k in epoch]
    # a record names the temporary checkpoint folder $SCRATCH and this Python `python`
    # a CPU record names the size of oneDNN's kernel cache it trained with (the entry point's, or the
    # user's) and its allocator: QKNORM_MALLOC's default, auto, checked against the run's log line
    malloc = allocator.resolve("auto", allocator.search_dirs())[0]
    assert {r["allocator"] for r in recs} == {malloc}
    assert ours["command"].startswith("{}={} QKNORM_MALLOC={} python -m ".format(*onednn_cache(), malloc))
    assert "--save-dir '$SCRATCH/ckpt/demo/postnorm'" in ours["command"]
    assert "--save-dir '$SCRATCH/fairseq_transformer'" in stock["command"]
    assert "python -m qknorm_pipeline.fairseq_train" in ours["command"] and "--arch transformer_postnorm" in ours["command"]
    assert "--fast-dropout --length-buckets 3" in fast["command"] and "--fast-dropout" not in ours["command"]
    assert "--arch transformer " in stock["command"] and "--user-dir" not in stock["command"]
    # our rows: the one sync of an update is fairseq's finite-gradient check; multi-tensor Adam and clip
    for r in (ours, fast):
        assert r["syncs"] == 1 and "trainer.py" in r["sync_sites"][0]["where"], r["sync_sites"]
        assert r["ops"]["step"] < 20 and r["ops"]["clip"] < 20
    # stock fairseq: its padding tests in the encoder and decoder, and the per-parameter Adam
    assert stock["syncs"] > 1 and stock["ops"]["step"] > 100
    assert fast["shapes_per_epoch"] <= min(4, ours["shapes_per_epoch"]) and fast["padding"] > ours["padding"]
    assert f"| fairseq_transformer | fp32 | {malloc} |" in p.stdout and f"| postnorm | fp32 | {malloc} |" in p.stdout
    mm = ours["op_families"]["matrix products"]
    assert f"| {mm:.0f} ({mm / ours['update_ms']:.0%}) | {ours['update_ms'] / mm:.2f}× |" in p.stdout
    again = script("benchmark.sh", *argv[:4], "postnorm", "--no-profile", *argv[7:], root=tmp_path)
    assert again.returncode == 0, again.stderr[-2000:]
    recs = json.loads(out.read_text())
    assert len(recs) == 4 and "ops" not in recs[-1]  # appended, the first kept
    # a records file that cannot be appended to is refused before the measuring, not after it
    bad = tmp_path / "bad.json"
    bad.write_text('[{"system": ')
    refused = script("benchmark.sh", *argv[:-len(tiny) - 3], "--out", str(bad), "--", *tiny, root=tmp_path)
    assert refused.returncode == 1 and "rep 1/" not in refused.stderr, refused.stderr[-2000:]
    assert f"{bad}: not valid JSON (" in refused.stderr and "--out" in refused.stderr.splitlines()[-1]
    missing = script("benchmark.sh", "fairseq-train", "--pair", "en-vi", root=tmp_path)
    assert missing.returncode == 1
    assert "no prepared data in" in missing.stderr and "bash scripts/prepare.sh en-vi first" in missing.stderr


def test_bf16_rows_on_a_cpu_with_bf16(tiny_data, tmp_path):
    if not cpu_has_bf16():
        pytest.skip("this CPU has no native bf16 instructions (AVX512-BF16, AMX)")
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    out = tmp_path / "throughput.json"
    tiny = [f for f in TINY_RECIPE if not f.startswith("{")]
    tiny = tiny[:tiny.index("--eval-bleu-args")]
    p = script("benchmark.sh", "fairseq-train", "--pair", "demo", "--systems", "qknorm", "fairseq_transformer",
               "--precisions", "bf16", "--updates", "8", "--warmup", "2", "--log-interval", "1", "--out", str(out),
               "--", *tiny, root=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    ours, stock = json.loads(out.read_text())
    assert ours["precision"] == stock["precision"] == "bf16"
    assert "--cpu --bf16" in stock["command"] and "--bf16" in ours["command"]
    # the flat fp32 master: one tensor clipped and stepped, two multi-tensor copies
    assert ours["syncs"] == 1 and ours["ops"]["step"] < 20 and ours["ops"]["clip"] < 20


def test_step_profile_counts_a_bf16_update_on_any_cpu(tiny_data, tmp_path):
    """step_profile runs --cpu --bf16 also where torch emulates bf16 (op counts do not depend on the
    instructions, and it says so): the flat fp32 master's few clip and step ops, one sync."""
    out = tmp_path / "profile.json"
    args = train_args(str(tiny_data / "bin"), str(tmp_path / "ckpt"), "transformer_qknorm", "--task", "translation_qk",
                      "--optimizer", "multi_tensor_adam", "--clip-norm", "1.0", "--cpu", "--bf16", "--max-update", "5",
                      "--disable-validation", "--no-save", "--log-interval", "100")
    p = subprocess.run([sys.executable, "-m", "qknorm_pipeline.benchmark.step_profile", str(out), "--update", "4",
                        "--", *args], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert ("[step_profile] this CPU emulates bf16" in p.stderr) == (not cpu_has_bf16())
    profile = json.loads(out.read_text())
    assert profile["update"] == 4 and profile["syncs"] == 1
    assert profile["ops"]["step"] < 20 and profile["ops"]["clip"] < 20


def test_step_profile_reports_the_packed_decoders_grids(tiny_data, tmp_path):
    """With --packed-decoder: one grid per batch pads as the target side does and computes every
    score of it; groups pad less and compute fewer."""
    profiles = []
    for groups in ("1", "3"):
        out = tmp_path / f"profile{groups}.json"
        args = train_args(str(tiny_data / "bin"), str(tmp_path / "ckpt"), "transformer_qknorm", "--task",
                          "translation_qk", "--packed-decoder", "--packed-groups", groups, "--cpu", "--max-update", "3",
                          "--disable-validation", "--no-save", "--log-interval", "100")
        p = subprocess.run([sys.executable, "-m", "qknorm_pipeline.benchmark.step_profile", str(out), "--update", "2",
                            "--", *args], capture_output=True, text=True, cwd=REPO)
        assert p.returncode == 0, p.stderr[-3000:]
        profiles.append(json.loads(out.read_text()))
    one, grouped = profiles
    assert one["padding_packed_grids"] == pytest.approx(one["padding_target"]) and one["packed_scores"] == 1
    assert grouped["padding_target"] == one["padding_target"] > grouped["padding_packed_grids"]
    assert grouped["packed_scores"] < 1
