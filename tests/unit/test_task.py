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


class DeviceTarget(torch.Tensor):
    """Stands for a batch's targets on a GPU: records each op that reads it; `.cpu()` gives a host copy."""
    reads = []

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        cls.reads.append(func.__name__)
        with torch._C.DisableTorchFunctionSubclass():
            return args[0].clone() if func.__name__ == "cpu" else func(*args, **(kwargs or {}))


def test_bleu_reads_the_batchs_targets_once_and_scores_as_fairseq():
    from fairseq.tasks.translation import TranslationTask

    from qknorm_fairseq.dictionary import ListStringDictionary

    d = ListStringDictionary()
    for w in "the cat sat on a mat".split():
        d.add_symbol(w)
    task = TranslationQKTask(TranslationQKConfig(eval_tokenized_bleu=True), d, d)
    task.tokenizer = None
    words = [[4, 5, 6, 7, 8, 9, 2], [4, 5, 6, 2, 1, 1, 1], [8, 9, 7, 4, 5, 2, 1]]  # 1: pad, 2: eos
    target = torch.tensor(words)
    hyps = [[4, 5, 6, 7, 9, 2], [4, 6, 2], [8, 9, 7, 4, 5, 2]]

    class Generator:
        def generate(self, models, sample, **kwargs):
            return [[{"tokens": torch.tensor(h)}] for h in hyps]

    def stats(bleu):
        return bleu.sys_len, bleu.ref_len, bleu.counts, bleu.totals

    DeviceTarget.reads.clear()
    ours = task._inference_with_bleu(Generator(), {"target": target.as_subclass(DeviceTarget)}, None)
    assert DeviceTarget.reads == ["cpu"]
    assert stats(ours) == stats(TranslationTask._inference_with_bleu(task, Generator(), {"target": target}, None))
    DeviceTarget.reads.clear()
    TranslationTask._inference_with_bleu(task, Generator(), {"target": target.as_subclass(DeviceTarget)}, None)
    # fairseq's: a row per sentence, each then stripped and copied to the host on its own
    assert DeviceTarget.reads == ["__getitem__"] * len(words)


def test_tokenized_bleu_scores_large_batches_without_sacrebleus_detokenize_warning(caplog):
    from fairseq.tasks.translation import TranslationTask

    from qknorm_fairseq.dictionary import ListStringDictionary

    d = ListStringDictionary()
    for w in "the cat sat on a mat .".split():
        d.add_symbol(w)
    task = TranslationQKTask(TranslationQKConfig(eval_tokenized_bleu=True), d, d)
    task.tokenizer = None
    rows = 120  # sacrebleu warns from 100 hypotheses ending in " ." in one call
    target = torch.tensor([[4, 5, 6, 10, 2]] * rows)  # "the cat sat ."
    hyps = [[4, 5, 10, 2]] * rows  # "the cat ."

    class Generator:
        def generate(self, models, sample, **kwargs):
            return [[{"tokens": torch.tensor(h)}] for h in hyps]

    with caplog.at_level("WARNING", logger="sacrebleu"):
        fairseqs = TranslationTask._inference_with_bleu(task, Generator(), {"target": target}, None)
    assert "forgot to detokenize" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="sacrebleu"):
        ours = task._inference_with_bleu(Generator(), {"target": target}, None)
    assert caplog.text == ""
    assert (ours.sys_len, ours.ref_len, ours.counts, ours.totals) == \
        (fairseqs.sys_len, fairseqs.ref_len, fairseqs.counts, fairseqs.totals) == (3 * rows, 4 * rows, [3 * rows, rows, 0, 0],
                                                                                  [3 * rows, 2 * rows, rows, 0])


@pytest.mark.parametrize("precision, dtype", [("fp32", None), ("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_inference_step_decodes_under_autocast_in_its_precision(monkeypatch, precision, dtype):
    """--decode-precision: the search runs under autocast of that dtype on the model's device, fp32
    without autocast (the machine check is patched out: the CPU running the tests may lack bf16 kernels)."""
    from qknorm_fairseq import task as task_module

    monkeypatch.setattr(task_module, "precision_problem", lambda precision, device: None)
    d = Dictionary()
    task = TranslationQKTask(TranslationQKConfig(decode_precision=precision), d, d)
    seen = []

    class Generator:
        def generate(self, models, sample, **kwargs):
            seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
            return []

    task.inference_step(Generator(), [torch.nn.Linear(2, 2)], {})
    (enabled, autocast_dtype), = seen
    assert enabled == (dtype is not None)
    if dtype is not None:
        assert autocast_dtype == dtype
