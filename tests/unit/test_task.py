"""The translation_qk task (qknorm_fairseq/task.py): GNMT length normalisation's formula and the flags it refuses
(fairseq-generate with it: tests/integration/test_gnmt_generate.py), validation's BLEU, decoding precision, and a
validation batch encoded once."""
import argparse
from unittest import mock

import pytest
import torch
from fairseq.data import Dictionary

from qknorm_fairseq.task import TranslationQKConfig, TranslationQKTask, gnmt_penalty, gnmt_rerank

from helpers import TINY_MODEL, USER_DIR


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


@pytest.mark.parametrize("flag, value, name", [("min_len", 6, "--min-len"), ("unkpen", 1.0, "--unkpen"),
                                              ("no_repeat_ngram_size", 3, "--no-repeat-ngram-size"),
                                              ("diverse_beam_groups", 2, "--diverse-beam-groups"),
                                              ("match_source_len", True, "--match-source-len")])
def test_twt_search_refuses_the_generation_flags_it_would_not_read(flag, value, name):
    args = argparse.Namespace(beam=4, **{flag: value})
    with pytest.raises(ValueError, match=f"--beam-search twt \\(the original code's search\\) has no {name}: drop {name}, "
                                         "or use --beam-search fairseq"):
        _task(beam_search="twt").build_generator([], args)


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


@pytest.mark.parametrize("arch, search, precision", [("transformer_qknorm", "twt", "fp32"),
                                                     ("transformer_fixnorm", "fairseq", "fp32"),
                                                     ("transformer_prenorm", "twt", "fp32"),
                                                     ("transformer", "fairseq", "fp32"),
                                                     ("transformer_qknorm", "twt", "bf16")])
def test_a_validation_batch_is_encoded_once_with_the_same_loss_and_hypotheses(monkeypatch, tiny_data, arch, search,
                                                                               precision):
    """valid_step with --eval-bleu: the search reuses the loss's encoder output (one encoder call, not two), and the
    loss, the hypotheses and BLEU's statistics are those of fairseq's valid_step, which encodes the batch twice;
    a search in another precision (--decode-precision bf16: under autocast) encodes the batch itself."""
    from fairseq import options, tasks
    from fairseq.models.transformer import TransformerEncoderBase
    from fairseq.tasks.translation import TranslationTask

    from qknorm_fairseq import task as task_module

    monkeypatch.setattr(task_module, "precision_problem", lambda precision, device: None)

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(tiny_data / "bin"), "--user-dir", USER_DIR, "--task", "translation_qk", "--arch", arch, *TINY_MODEL,
        "--share-all-embeddings", "--criterion", "masked_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
        "--eval-bleu", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 5}', "--length-norm", "gnmt",
        "--beam-search", search, "--decode-precision", precision])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    model, criterion = task.build_model(args), task.build_criterion(args)
    task.load_dataset("valid")
    ds = task.dataset("valid")
    sample = ds.collater([ds[i] for i in range(12)])
    encoded, hypotheses = [], []
    forward, generate = TransformerEncoderBase.forward, task.sequence_generator.generate

    def counted(self, *a, **kw):
        encoded.append(torch.is_grad_enabled())
        return forward(self, *a, **kw)

    def kept(*a, **kw):
        hypotheses.append([h[0]["tokens"].tolist() for h in generate(*a, **kw)])
        return [[{"tokens": torch.tensor(h)}] for h in hypotheses[-1]]

    with mock.patch.object(TransformerEncoderBase, "forward", counted), mock.patch.object(task.sequence_generator, "generate", kept):
        ours = task.valid_step(sample, model, criterion)
        calls = 1 if precision == "fp32" else 2
        assert encoded == [False] * calls
        fairseqs = TranslationTask.valid_step(task, sample, model, criterion)
        assert encoded == [False] * (calls + 2)
    assert "forward" not in model.encoder.__dict__  # the encoder as it was after the step
    assert hypotheses[0] == hypotheses[1] and any(len(h) > 1 for h in hypotheses[0])
    assert ours[0].item() == fairseqs[0].item() and ours[1] == fairseqs[1]
    assert {k: v for k, v in ours[2].items() if k != "loss"} == {k: v for k, v in fairseqs[2].items() if k != "loss"}
