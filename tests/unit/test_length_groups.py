"""--length-groups: a batch split by target length, trimmed, and its gradient added up group by group."""
import pytest
import torch

from qknorm_fairseq.criterion import MaskedLabelSmoothedCrossEntropyCriterion
from qknorm_fairseq.length_groups import merged_logs, split_by_target_length

from helpers import NO_DROPOUT, build, train_sample


def _rows(tokens, pad):
    return sorted(tuple(t for t in row.tolist() if t != pad) for row in tokens)


def test_groups_hold_every_sentence_once_sorted_by_target_length_and_trimmed(tiny_data):
    _, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT)
    sample, pad = train_sample(task), task.tgt_dict.pad()
    groups = split_by_target_length(sample, 3, pad)
    assert [g["nsentences"] for g in groups] == [4, 4, 3]
    assert sorted(i for g in groups for i in g["id"].tolist()) == sorted(sample["id"].tolist())
    assert sum(g["ntokens"] for g in groups) == sample["ntokens"]
    longest = [int(g["target"].ne(pad).sum(1).max()) for g in groups]
    assert longest == sorted(longest) and longest[-1] == sample["target"].size(1)
    for key in ("src_tokens", "prev_output_tokens"):
        parts = [g["net_input"][key] for g in groups]
        assert sorted(r for p in parts for r in _rows(p, pad)) == _rows(sample["net_input"][key], pad)
        for p in parts:  # no column that is padding in every row, at either end
            assert p.ne(pad).any(0).all()
    for g in groups:
        assert g["target"].shape == g["net_input"]["prev_output_tokens"].shape
        assert torch.equal(g["net_input"]["src_lengths"], g["net_input"]["src_tokens"].ne(pad).sum(1))
    # less padding computed than the batch's
    assert sum(g["target"].numel() for g in groups) < sample["target"].numel()
    assert len(split_by_target_length(sample, 50, pad)) == 11  # never an empty group


def test_merged_logs_add_up_every_field():
    assert merged_logs([{"loss": 1.5, "ntokens": 3}, {"loss": 2.0, "ntokens": 4}]) == {"loss": 3.5, "ntokens": 7}


class Backward:
    def backward(self, loss):
        loss.backward()


def test_a_batch_in_groups_gives_the_whole_batchs_gradient_and_logs(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT)
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    sample = train_sample(task)
    results = {}
    for k in (1, 3):
        task.cfg.length_groups = k
        model.zero_grad()
        loss, size, log = task.train_step(sample, model, criterion, Backward(), update_num=0)
        results[k] = loss, size, log, [p.grad.clone() for p in model.parameters()]
    (loss1, size1, log1, grads1), (loss3, size3, log3, grads3) = results[1], results[3]
    assert size1 == size3 == sample["ntokens"] and log1["ntokens"] == log3["ntokens"]
    assert log1["nsentences"] == log3["nsentences"] == 11
    assert loss3.item() == pytest.approx(loss1.item(), rel=1e-5)
    assert float(log3["nll_loss"]) == pytest.approx(float(log1["nll_loss"]), rel=1e-5)
    for g1, g3 in zip(grads1, grads3):
        assert torch.allclose(g3, g1, rtol=1e-4, atol=1e-5 * g1.abs().max().item())
    assert any(g.abs().max() > 0 for g in grads1)


def test_length_groups_below_one_are_refused(tiny_data):
    with pytest.raises(ValueError, match=r"--length-groups 0 must be >= 1 \(1: each batch whole\)"):
        build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--length-groups", "0")
