"""`bash scripts/benchmark.sh validation`: fairseq-train's validation (dev-set decoding) timed at
several validation batch sizes, on the tiny pipeline's trained checkpoint (CPU)."""
import json
import re

import torch

from helpers import script


def test_validation_is_timed_at_each_batch_size_and_reproduces_fairseq_trains_dev_bleu(tiny_pipeline, tmp_path):
    ckpt = tiny_pipeline / "checkpoints" / "demo" / "postnorm" / "checkpoint_best.pt"
    out = tmp_path / "validation.json"
    p = script("benchmark.sh", "validation", "--pair", "demo", "--checkpoint", str(ckpt), "--max-tokens-valid",
               "512", "80", "64", "--profile", "--label", "test", "--out", str(out), root=tiny_pipeline)
    assert p.returncode == 0, p.stderr[-3000:]
    recs = json.loads(out.read_text())
    assert [(r["max_tokens_valid"], r["rep"]) for r in recs] == [(512, 1), (80, 1), (64, 1)]
    as_trained, small, short = recs
    # 512 tokens is the batch fairseq-train validated with (its --max-tokens): the dev BLEU it stored
    # with this checkpoint (fairseq keeps the best-checkpoint metric as extra_state val_loss)
    stored = torch.load(ckpt, map_location="cpu", weights_only=False)["extra_state"]["val_loss"]
    assert as_trained["bleu"] == stored, (as_trained["bleu"], stored)
    # smaller batches: more of them and more decoder calls, the same sentences and translations
    assert small["batches"] > as_trained["batches"] and small["decoder_calls"] > as_trained["decoder_calls"]
    assert small["sentences"] == as_trained["sentences"] == 40 and small["bleu"] == as_trained["bleu"]
    # fairseq's batches hold a multiple of 8 sentences and an incomplete last batch is left out: at 64
    # tokens the 40 dev sentences make batches of 8, 8, 8, 8, 7 and 1, so the longest is not scored
    assert (short["sentences"], short["of_sentences"]) == (39, 40) and "| 39 of 40 |" in p.stdout
    assert all(r["decoder_calls"] >= r["batches"] and r["seconds"] > 0 for r in recs)
    assert as_trained["model"].endswith("checkpoint_best.pt") and as_trained["label"] == "test"
    assert as_trained["command"].startswith("bash scripts/benchmark.sh validation --pair demo --checkpoint ")
    assert as_trained["command"].endswith("--max-tokens-valid 512 80 64 --reps 1 --precision fp32 --profile")
    assert "| 64 |" in p.stdout and "| 512 |" in p.stdout and "time vs the first" in p.stdout
    # one batch profiled (--profile, first record only): BLEU's token strings are made from lists, not
    # read token by token from tensors (no ATen op); fairseq's decoder tests its input for padding
    # (a sync) in every call
    prof = as_trained["profile"]
    assert "profile" not in small and prof["decoder_calls"] > 1 and prof["ops"]["decoder"] > 0
    assert prof["ops"]["strings"] == 0
    assert prof["syncs"]["decoder"] == prof["decoder_calls"]
    assert "transformer_decoder.py:" in next(iter(prof["sync_sites"])), prof["sync_sites"]
    # the strings of a validation timed both ways, on its own tokens
    assert all(as_trained["strings_seconds"][way] > 0 for way in ("task", "fairseq"))
    assert "fairseq's Dictionary.string" in p.stderr and "profile of one batch" in p.stderr
    # refused in one line, nothing appended
    for argv, says in ((["--checkpoint", str(tmp_path / "nope.pt")], "no such file"),
                       (["--max-tokens-valid", "0"], "a batch holds at least 1 token"),
                       (["--checkpoint", str(ckpt), "--max-tokens-valid", "512", "8"], "use at least ")):
        bad = script("benchmark.sh", "validation", "--pair", "demo", *argv, "--out", str(out), root=tiny_pipeline)
        assert bad.returncode != 0 and says in bad.stderr.strip().splitlines()[-1], bad.stderr[-2000:]
    assert len(json.loads(out.read_text())) == 3


def test_the_c_loops_are_timed_off_and_on_side_by_side(tiny_pipeline, tmp_path):
    """--c-loops off on: each setting on the same batches, in that order, recorded and tabled; this model (no
    --fused-kernels) decodes through no C loop, so both make the same hypotheses."""
    ckpt = tiny_pipeline / "checkpoints" / "demo" / "postnorm" / "checkpoint_best.pt"
    out = tmp_path / "validation.json"
    p = script("benchmark.sh", "validation", "--pair", "demo", "--checkpoint", str(ckpt), "--max-tokens-valid", "512",
               "--c-loops", "off", "on", "--out", str(out), root=tiny_pipeline)
    assert p.returncode == 0, p.stderr[-3000:]
    off, on = json.loads(out.read_text())
    assert (off["c_loops"], on["c_loops"]) == ("off", "on") and on["same_hypotheses"] and on["bleu"] == off["bleu"]
    assert on["command"].endswith("--max-tokens-valid 512 --reps 1 --precision fp32 --c-loops off on")
    assert re.search(r"\| 512 \| \w+ \| off \|", p.stdout) and re.search(r"\| 512 \| \w+ \| on \|", p.stdout)
    assert "decoder step, C loops off:" in p.stderr
