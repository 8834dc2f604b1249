"""--packed-encoder: the encoder's training forward on the source's tokens only (qknorm_fairseq/encoder_rows.py)
gives the padded encoder's output, loss and gradients, with and without the packed decoder."""
import pytest
import torch

import qknorm_fairseq.encoder_rows as encoder_rows_module
from qknorm_fairseq import decoder_rows
from qknorm_fairseq.criterion import MaskedLabelSmoothedCrossEntropyCriterion
from qknorm_fairseq.encoder_rows import encoder_rows

from helpers import NO_DROPOUT, Backward, build, train_sample

# softmax over dot products, QKNorm, Lp-QKNorm; pre- and post-norm; ScaleNorm; FixNorm; DNAS and HNAS in the encoder
CASES = [("transformer_qknorm",), ("transformer_lpqknorm",), ("transformer_postnorm",), ("transformer_prenorm",),
         ("transformer_scalenorm",), ("transformer_fixnorm",), ("transformer_dnas",), ("transformer_hnas",),
         ("transformer_qknorm", "--attention-kernel", "matmul")]


def _loss_and_grads(model, task, sample, packed):
    model.encoder.packed = packed
    model.zero_grad()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    loss, _, _ = task.train_step(sample, model, criterion, Backward(), update_num=0)
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _assert_same(got, want, rtol=1e-5):
    assert got[0] == pytest.approx(want[0], rel=rtol)
    assert got[1].keys() == want[1].keys()
    # atol on the largest gradient's scale: some gradients are zero but for rounding
    scale = max(g.abs().max().item() for g in want[1].values())
    assert scale > 0
    for name, g in want[1].items():
        assert torch.allclose(got[1][name], g, rtol=1e-4, atol=1e-6 * scale), name


@pytest.mark.parametrize("decoder", [False, True], ids=["padded-decoder", "packed-decoder"])
@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_the_packed_encoder_gives_the_padded_encoders_loss_and_gradients(tiny_data, case, decoder):
    model, task = build(tiny_data / "bin", *case, *NO_DROPOUT, "--packed-encoder",
                        *(["--packed-decoder"] if decoder else []))
    model.train()
    sample = train_sample(task)
    assert sample["net_input"]["src_tokens"].eq(task.src_dict.pad()).any(), "the batch must hold source padding"
    padded, packed = (_loss_and_grads(model, task, sample, p) for p in (False, True))
    _assert_same(packed, padded)


def test_the_packed_encoders_output_is_fairseqs_at_the_tokens_and_zero_at_the_pads(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-encoder")
    model.train()
    src = train_sample(task)["net_input"]["src_tokens"]
    pad = src.eq(task.src_dict.pad())
    assert pad[:, 0].any() and not pad[:, -1].any(), "fairseq pads sources on the left"
    want = model.encoder.forward_scriptable(src)["encoder_out"][0]  # (src_len, bsz, embed)
    out = encoder_rows(model.encoder, src)
    got = out["encoder_out"][0]
    assert got.shape == want.shape and got.is_contiguous()
    tokens = ~pad.t()
    assert torch.allclose(got[tokens], want[tokens], rtol=1e-5, atol=1e-5)
    assert not got[~tokens].any()
    # the rows: one per token, in the batch's order, then the padding rows
    rows = out["source_rows"][0]
    assert out["encoder_rows"][0].shape[0] == int(tokens.sum()) + rows.pad_rows
    assert torch.equal(out["encoder_padding_mask"][0], pad)
    assert encoder_rows(model.encoder, src, grid=False)["encoder_out"] == []


def test_padding_rows_change_no_loss_and_no_gradient(tiny_data, monkeypatch):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-encoder", "--packed-decoder")
    model.train()
    sample = train_sample(task)
    results = {}
    monkeypatch.setattr(decoder_rows, "pads_rows", lambda module: True)  # as in bf16 on a CPU
    monkeypatch.setattr(encoder_rows_module, "pads_rows", lambda module: True)
    for extra in (0, 5):
        monkeypatch.setattr(decoder_rows, "padded_size", lambda n, _extra=extra: n + _extra)
        results[extra] = _loss_and_grads(model, task, sample, True)
    _assert_same(results[5], results[0], rtol=1e-6)


def test_the_packed_encoder_runs_in_training_only(tiny_data, monkeypatch):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-encoder")
    sample = train_sample(task)
    calls = []
    monkeypatch.setattr(model.encoder, "forward_embedding",
                        lambda *a, f=model.encoder.forward_embedding: calls.append(1) or f(*a))
    import qknorm_fairseq.model as model_module

    rows_calls = []
    monkeypatch.setattr(model_module, "encoder_rows", lambda *a, **k: rows_calls.append(1) or encoder_rows(*a, **k))
    model.eval()
    model(**sample["net_input"])
    assert calls and not rows_calls
    model.train()
    model(**sample["net_input"])
    assert rows_calls == [1]


@pytest.mark.parametrize("part", ["encoder", "decoder"])
def test_what_a_packed_encoder_or_decoder_cannot_run_is_refused(tiny_data, part):
    flag = f"--packed-{part}"
    with pytest.raises(ValueError, match=f"{flag} cannot run this {part}: --checkpoint-activations wraps its layers; "
                                         f"drop {flag}"):
        build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, flag, "--checkpoint-activations")
    with pytest.raises(ValueError, match=f"--compile compiles each layer's forward, which {flag}'s training forward "
                                         "does not call: drop one of them"):
        build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, flag, "--compile")
