"""A tiny trained qknorm_transformer decoded by fairseq-generate with either decoder step of the task
(--decoder-step fairseq, fairseq's incremental state; cached, qknorm_fairseq/decoder_cache.py) and both
searches: the same hypotheses, scores and per-token scores; and the validation benchmark timing both
steps side by side on the same model."""
import json
import os
import shutil

import pytest

from helpers import BIN, TINY_MODEL, USER_DIR, run, script


@pytest.fixture(scope="module")
def trained(tiny_data, tmp_path_factory):
    """A QKNorm preset trained 80 updates on the tiny corpus, its validation decoding with the TwT search."""
    save = tmp_path_factory.mktemp("qknorm") / "ck"
    run([os.path.join(BIN, "fairseq-train"), str(tiny_data / "bin"), "--user-dir", USER_DIR, "--task", "translation_qk",
         "--arch", "transformer_qknorm", *TINY_MODEL, "--optimizer", "adam", "--lr", "5e-3", "--max-tokens", "1000",
         "--max-update", "80", "--save-dir", str(save), "--no-progress-bar", "--seed", "1", "--num-workers", "0",
         "--no-epoch-checkpoints", "--criterion", "masked_label_smoothed_cross_entropy", "--dropout", "0.1",
         "--eval-bleu", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 50}',
         "--length-norm", "gnmt", "--beam-search", "twt", "--best-checkpoint-metric", "bleu",
         "--maximize-best-checkpoint-metric", "--cpu"])
    return save / "checkpoint_last.pt"


def _generate(tiny_data, ckpt, *flags):
    out = run([os.path.join(BIN, "fairseq-generate"), str(tiny_data / "bin"), "--user-dir", USER_DIR, "--task",
               "translation_qk", "--path", str(ckpt), "--beam", "4", "--nbest", "4", "--max-len-a", "1",
               "--max-len-b", "50", "--batch-size", "16", "--length-norm", "gnmt", "--cpu", *flags]).stdout
    return sorted(line for line in out.splitlines() if line.startswith(("H-", "P-")))


@pytest.mark.parametrize("search", ["twt", "fairseq"])
def test_fairseq_generate_makes_the_same_hypotheses_with_either_step(tiny_data, trained, search):
    old = _generate(tiny_data, trained, "--beam-search", search, "--decoder-step", "fairseq")
    new = _generate(tiny_data, trained, "--beam-search", search)  # the task's default step: cached
    assert len([h for h in old if h.startswith("H-")]) == 4 * 40
    assert new == old
    # a trained model: hypotheses end with EOS at different lengths, not all at the length limit
    assert len({len(h.split("\t")[2].split()) for h in old if h.startswith("H-")}) > 3


def test_validation_benchmark_times_both_steps_side_by_side(tiny_data, trained, tmp_path):
    root = tmp_path / "root"
    shutil.copytree(tiny_data / "bin", root / "data-bin" / "demo")
    out = tmp_path / "validation.json"
    p = script("benchmark.sh", "validation", "--pair", "demo", "--checkpoint", str(trained), "--max-tokens-valid",
               "512", "--decoder-steps", "fairseq", "cached", "--profile", "--out", str(out), root=root)
    assert p.returncode == 0, p.stderr[-3000:]
    old, new = json.loads(out.read_text())
    assert (old["decoder_step"], new["decoder_step"]) == ("fairseq", "cached")
    assert new["same_hypotheses"] and new["bleu"] == old["bleu"] and new["decoder_calls"] == old["decoder_calls"]
    assert new["command"].endswith("--profile --decoder-steps fairseq cached")
    # the cached step dispatches fewer ATen ops per decoder call, and its decoder reads no device value
    calls = old["profile"]["decoder_calls"]
    assert sum(new["profile"]["ops"].values()) < 0.8 * sum(old["profile"]["ops"].values())
    assert new["profile"]["ops"]["decoder"] < 0.6 * old["profile"]["ops"]["decoder"]
    assert old["profile"]["syncs"]["decoder"] == calls and new["profile"]["syncs"].get("decoder", 0) == 1  # the loss
    assert "| 512 | fairseq |" in p.stdout and "| 512 | cached |" in p.stdout and "| yes |" in p.stdout
    assert "| decoder step | ATen ops per decoder call" in p.stdout
