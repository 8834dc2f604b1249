"""--packed-decoder: the decoder's training forward on the target's tokens only (qknorm_fairseq/decoder_rows.py)
gives the padded decoder's loss and gradients, for every kind of decoder layer."""
import pytest
import torch

from qknorm_fairseq.criterion import MaskedLabelSmoothedCrossEntropyCriterion
from qknorm_fairseq.decoder_rows import Rows

from helpers import build

NO_DROPOUT = ["--task", "translation_qk", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
              "--word-dropout", "0", "--decoder-layers", "2"]
# softmax over dot products, QKNorm (p = 2), Lp-QKNorm (p = 4); pre- and post-norm; LayerNorm, ScaleNorm,
# RMSNorm; FixNorm's tied output layer; HNAS in the encoder; the matmul kernel, output bias and vocabulary mask;
# the output layer over all types (every preset but the last masks the vocabulary: logits of the allowed types)
CASES = [("transformer_qknorm",), ("transformer_lpqknorm",), ("transformer_postnorm",), ("transformer_prenorm",),
         ("transformer_scalenorm",), ("transformer_rmsnorm",), ("transformer_fixnorm",),
         ("transformer_hnas",),
         ("transformer_qknorm", "--attention-kernel", "matmul", "--output-bias", "--target-vocab-mask"),
         ("transformer_qknorm", "--no-target-vocab-mask")]


def _sample(task, n=11):
    task.load_dataset("train")
    ds = task.dataset("train")
    return ds.collater([ds[i] for i in range(n)])


class Backward:
    def backward(self, loss):
        loss.backward()


def _loss_and_grads(model, task, criterion, sample, packed):
    model.decoder.packed = packed
    model.zero_grad()
    loss, size, log = task.train_step(sample, model, criterion, Backward(), update_num=0)
    return loss.item(), float(log["nll_loss"]), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fused", [True, False], ids=["fused-loss", "log-softmax"])
@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_the_packed_decoder_gives_the_padded_decoders_loss_and_gradients(tiny_data, case, fused):
    model, task = build(tiny_data / "bin", *case, *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         fused_loss=fused)
    sample = _sample(task)
    pad = task.tgt_dict.pad()
    assert sample["target"].eq(pad).any(), "the batch must hold padding for the test to mean anything"
    if model.decoder.output_bias is not None:  # zero-initialised: a wrong bias would show in no forward
        with torch.no_grad():
            model.decoder.output_bias.normal_()
    # with the vocabulary mask, the logits of the allowed types only
    assert ("packed_types" in model(**sample["net_input"])[1]) == model.decoder.mask_output
    padded, packed = (_loss_and_grads(model, task, criterion, sample, p) for p in (False, True))
    assert packed[0] == pytest.approx(padded[0], rel=1e-5)
    assert packed[1] == pytest.approx(padded[1], rel=1e-5)
    assert packed[2].keys() == padded[2].keys()
    # atol on the largest gradient's scale: some gradients are zero but for rounding (softmax ignores
    # the key projection's bias)
    scale = max(g.abs().max().item() for g in padded[2].values())
    assert scale > 0
    for name, g in padded[2].items():
        assert torch.allclose(packed[2][name], g, rtol=1e-4, atol=1e-6 * scale), name


def test_the_packed_decoder_computes_one_row_per_target_token_in_training_only(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    sample = _sample(task)
    real = sample["target"].ne(task.tgt_dict.pad())
    model.train()
    logits, extra = model(**sample["net_input"])
    # the allowed types' logits only, the targets as their columns
    allowed = model.decoder.allowed_types
    assert 0 < int(allowed.sum()) < len(allowed)
    assert logits.shape == (int(real.sum()), int(allowed.sum())) and real.sum() < sample["target"].numel()
    targets = model.get_targets(sample, (logits, extra))
    assert torch.equal(allowed.nonzero().squeeze(1)[targets], sample["target"][real])
    # some target is column padding_idx, which the criterion must not take for padding
    assert targets.eq(task.tgt_dict.pad()).any()
    model.eval()  # validation's loss and beam search: the padded decoder, fairseq's (batch, length, V) logits
    full, extra = model(**sample["net_input"])
    assert full.shape == (*sample["target"].shape, len(task.tgt_dict)) and "packed_rows" not in extra
    assert torch.isinf(full[..., ~allowed]).all()
    # the same values as the allowed columns of the padded decoder's logits
    model.train()
    assert torch.allclose(logits, full[real][:, allowed], rtol=1e-5, atol=1e-5)


def test_the_packed_decoder_reports_the_padded_decoders_accuracy(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         report_accuracy=True)
    sample = _sample(task)
    logs = []
    for packed in (False, True):
        model.decoder.packed = packed
        logs.append(criterion(model, sample)[2])
    assert logs[1]["total"] == logs[0]["total"] == int(sample["target"].ne(task.tgt_dict.pad()).sum())
    assert logs[1]["n_correct"] == logs[0]["n_correct"] > 0


@pytest.mark.parametrize("fused", [True, False], ids=["fused-loss", "log-softmax"])
def test_the_packed_decoder_gives_the_padded_decoders_loss_with_the_original_codes_smoothing(tiny_data, fused):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         fused_loss=fused, label_smoothing_form="uniform")
    sample = _sample(task)
    padded, packed = (_loss_and_grads(model, task, criterion, sample, p)[:2] for p in (False, True))
    assert packed == pytest.approx(padded, rel=1e-5)


def test_another_criterion_gets_every_types_logits(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder",
                        "--criterion", "cross_entropy")
    model.train()
    logits, extra = model(**_sample(task)["net_input"])
    assert not model.decoder.allowed_only and logits.size(-1) == len(task.tgt_dict) and "packed_types" not in extra


def test_a_loaded_mask_is_checked_against_the_training_targets_and_its_columns_rebuilt(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    sample = _sample(task)
    model.train()
    allowed = model.decoder.allowed_types
    n = int(allowed.sum())
    assert model(**sample["net_input"])[0].size(-1) == n
    # a checkpoint's mask that allows one more type: one more column
    state = model.state_dict()
    state["decoder.allowed_types"] = allowed.clone()
    state["decoder.allowed_types"][int((~allowed).nonzero()[-1])] = True
    model.load_state_dict(state)
    logits, extra = model(**sample["net_input"])
    assert logits.size(-1) == n + 1
    assert torch.equal(model.decoder.allowed_types.nonzero().squeeze(1)[model.get_targets(sample, (logits, extra))],
                       sample["target"][sample["target"].ne(task.tgt_dict.pad())])
    # one that forbids a type of the training targets: refused before any loss
    state["decoder.allowed_types"][int(sample["target"][0, 0])] = False
    model.load_state_dict(state)
    with pytest.raises(ValueError, match=r"the target vocabulary mask \(loaded from a checkpoint trained on other "
                                         r"data\) forbids 1 of the training targets' types, .*drop --packed-decoder"):
        model(**sample["net_input"])


def test_rows_take_and_grid_are_inverse_on_the_tokens():
    tokens = torch.tensor([[5, 6, 1, 1], [7, 8, 9, 1]])
    rows = Rows(tokens, pad=1)
    assert rows.index.tolist() == [0, 1, 4, 5, 6]
    x = torch.arange(8.0).view(2, 4, 1)
    assert rows.take(x).view(-1).tolist() == [0, 1, 4, 5, 6]
    assert rows.grid(rows.take(x)).view(2, 4).tolist() == [[0, 1, 0, 0], [4, 5, 6, 0]]


def test_what_the_packed_decoder_cannot_run_is_refused(tiny_data):
    with pytest.raises(ValueError, match="--packed-decoder cannot run this decoder: --checkpoint-activations wraps "
                                         "its layers; drop --packed-decoder"):
        build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder", "--checkpoint-activations")
    with pytest.raises(ValueError, match="--compile compiles each layer's forward, which --packed-decoder's "
                                         "training forward does not call: drop one of them"):
        build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder", "--compile")
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         ignore_prefix_size=1)
    with pytest.raises(ValueError, match="--packed-decoder returns no .* --ignore-prefix-size"):
        criterion(model, _sample(task))
