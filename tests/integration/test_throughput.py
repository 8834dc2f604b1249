"""`bash scripts/benchmark.sh fairseq-train`: real fairseq-train updates/s of a recipe against stock
fairseq, on the tiny corpus (CPU mode)."""
import json
import shutil

from helpers import TINY_RECIPE, script


def test_fairseq_train_throughput_appends_one_record_per_system(tiny_data, tmp_path):
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    out = tmp_path / "throughput.json"
    tiny = [f for f in TINY_RECIPE if not f.startswith("{")]
    tiny = tiny[:tiny.index("--eval-bleu-args")]
    argv = ["fairseq-train", "--pair", "demo", "--systems", "postnorm", "fairseq_transformer", "--updates", "6",
            "--warmup", "2", "--log-interval", "1", "--label", "test", "--out", str(out), "--", *tiny]
    p = script("benchmark.sh", *argv, root=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert [r["system"] for r in recs] == ["postnorm", "fairseq_transformer"]
    for r in recs:
        assert r["updates_per_s"] > 0 and r["device"].startswith("CPU") and r["precision"] == "fp32"
        assert (r["label"], r["pair"], r["updates"], r["warmup"]) == ("test", "demo", 6, 2)
    ours, stock = (r["command"] for r in recs)
    assert "python -m qknorm_pipeline.fairseq_train" in ours and "--arch transformer_postnorm" in ours
    assert "fairseq-train" in stock and "--arch transformer " in stock and "--user-dir" not in stock
    assert "| fairseq_transformer |" in p.stdout and "| postnorm |" in p.stdout
    again = script("benchmark.sh", *argv, root=tmp_path)
    assert again.returncode == 0 and len(json.loads(out.read_text())) == 4  # appended, the first kept
    missing = script("benchmark.sh", "fairseq-train", "--pair", "en-vi", root=tmp_path)
    assert missing.returncode == 1
    assert "no prepared data in" in missing.stderr and "bash scripts/prepare.sh en-vi first" in missing.stderr
