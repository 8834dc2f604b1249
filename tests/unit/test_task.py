"""GNMT length normalisation (qknorm_fairseq/task.py): the formula, and fairseq-generate with it."""
import argparse
import collections
import os

import pytest
import torch
from fairseq.data import Dictionary

from qknorm_fairseq.task import TranslationQKConfig, TranslationQKTask, gnmt_penalty, gnmt_rerank

from helpers import BIN, USER_DIR, run, train_cmd


def hypo(n_tokens, logprob):
    return {"tokens": torch.arange(n_tokens), "score": torch.tensor(logprob)}


def test_penalty_formula():
    assert gnmt_penalty(1, 0.6) == pytest.approx(1.0)
    assert gnmt_penalty(7, 0.6) == pytest.approx(2.0**0.6)
    assert gnmt_penalty(10, 0.0) == 1.0


def test_rerank_follows_the_formula_not_fairseq_lenpen():
    alpha = 0.6
    cands = [(3, -2.0), (12, -4.6), (6, -3.0), (20, -7.5)]
    ranked = gnmt_rerank([hypo(n, s) for n, s in cands], alpha)
    naive = sorted(cands, key=lambda c: c[1] / ((5 + c[0]) / 6) ** alpha, reverse=True)
    assert [len(h["tokens"]) for h in ranked] == [n for n, _ in naive]
    for h, (n, s) in zip(ranked, naive):
        assert float(h["score"]) == pytest.approx(s / ((5 + n) / 6) ** alpha)
    # the same candidates ranked by fairseq's --lenpen 0.6 (score / |y|^0.6) come out differently
    fairseq_rank = sorted(cands, key=lambda c: c[1] / c[0] ** alpha, reverse=True)
    assert [n for n, _ in fairseq_rank] != [n for n, _ in naive]


def _task(**overrides):
    d = Dictionary()
    d.add_symbol("a")
    cfg = TranslationQKConfig(length_norm="gnmt", **overrides)
    return TranslationQKTask(cfg, d, d)


@pytest.mark.parametrize("flag, value, name", [("lenpen", 0.6, "--lenpen"), ("unnormalized", True, "--unnormalized")])
def test_gnmt_refuses_conflicting_generation_flags(flag, value, name):
    args = argparse.Namespace(beam=4, **{flag: value})
    with pytest.raises(ValueError, match=f"--length-norm gnmt does not combine with {name}"):
        _task().build_generator([], args)


def _hypotheses(stdout):
    out = collections.defaultdict(list)
    for line in stdout.splitlines():
        if line.startswith("H-"):
            tag, score, text = line.split("\t")
            out[int(tag[2:])].append((text, float(score)))
    return out


def test_fairseq_generate_with_gnmt(tiny_data, tmp_path):
    data_bin = str(tiny_data / "bin")
    save = str(tmp_path / "ck")
    # --eval-bleu validation decodes with GNMT normalisation too
    run(train_cmd(data_bin, save, "--lr", "5e-3", "--max-update", "30", "--length-norm", "gnmt",
                   "--validate-interval", "1000",  # validate once, at the end
                   "--eval-bleu", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 50}',
                   "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"))
    gen = [os.path.join(BIN, "fairseq-generate"), data_bin, "--user-dir", USER_DIR,
           "--task", "translation_qk", "--path", os.path.join(save, "checkpoint_last.pt"), "--beam", "4",
           "--nbest", "4", "--max-len-a", "1", "--max-len-b", "50", "--batch-size", "16", "--max-sentences", "16"]
    raw = _hypotheses(run(gen + ["--unnormalized"]).stdout)
    gnmt = _hypotheses(run(gen + ["--length-norm", "gnmt", "--gnmt-alpha", "0.6"]).stdout)
    assert len(raw) == 40 and raw.keys() == gnmt.keys()
    reordered = 0
    for i in raw:
        # beam search finalises the same hypotheses; only the scores and their order change
        assert sorted(t for t, _ in raw[i]) == sorted(t for t, _ in gnmt[i])
        raw_score = dict(raw[i])
        for text, score in gnmt[i]:
            n_tokens = len(text.split()) + 1  # + EOS
            assert score == pytest.approx(raw_score[text] / ((5 + n_tokens) / 6) ** 0.6, rel=1e-5, abs=1e-6)
        scores = [s for _, s in gnmt[i]]
        assert scores == sorted(scores, reverse=True)
        reordered += [t for t, _ in gnmt[i]] != [t for t, _ in raw[i]]
    assert reordered > 0, "no sentence changed ranking: the test corpus does not exercise the normalisation"
