"""GNMT length normalisation (qknorm_fairseq/task.py): the formula and the flags it refuses
(fairseq-generate with it: tests/integration/test_gnmt_generate.py)."""
import argparse

import pytest
import torch
from fairseq.data import Dictionary

from qknorm_fairseq.task import TranslationQKConfig, TranslationQKTask, gnmt_penalty, gnmt_rerank


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
