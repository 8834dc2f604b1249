"""Fidelity to the original code's model: output bias, TwT Table 2's Xavier normal
init, and qknorm_transformer = fairseq's transformer at default flags."""
import math

import pytest
import torch
from fairseq import options, tasks

from helpers import TINY_MODEL, batch, build

TWT_PRESETS = ["transformer_postnorm", "transformer_prenorm", "transformer_fixnorm", "transformer_scalenorm",
               "transformer_qknorm", "transformer_hnas"]


@pytest.mark.parametrize("arch", TWT_PRESETS)
def test_presets_have_a_zero_initialised_output_bias(tiny_data, arch):
    model, task = build(tiny_data / "bin", arch)
    bias = model.decoder.output_bias
    assert bias is not None and bias.shape == (len(task.target_dictionary),)
    assert torch.equal(bias, torch.zeros_like(bias))
    assert any(p is bias for p in model.parameters())


def test_stock_and_no_output_bias_have_none(tiny_data):
    assert build(tiny_data / "bin", "qknorm_transformer")[0].decoder.output_bias is None
    assert build(tiny_data / "bin", "transformer_qknorm", "--no-output-bias")[0].decoder.output_bias is None


def test_output_bias_adds_to_fixnorm_logits_and_keeps_the_mask(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_fixnorm")
    model.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        before, _ = model(src, lengths, prev)
        model.decoder.output_bias.copy_(torch.arange(len(task.target_dictionary), dtype=torch.float))
        after, _ = model(src, lengths, prev)
    allowed = model.decoder.allowed_types
    assert torch.isinf(after[..., ~allowed]).all()
    assert torch.allclose(after[..., allowed] - before[..., allowed],
                          model.decoder.output_bias[allowed].expand_as(after[..., allowed]), atol=1e-5)
    # the bias learns
    model.train()
    out, _ = model(src, lengths, prev)
    out[..., allowed].sum().backward()
    assert model.decoder.output_bias.grad is not None and model.decoder.output_bias.grad[allowed].abs().sum() > 0


def test_old_state_dict_without_bias_loads(tiny_data):
    old, task = build(tiny_data / "bin", "transformer_qknorm", "--no-output-bias")
    state = old.state_dict()
    assert not any(k.endswith("output_bias") for k in state)
    new, _ = build(tiny_data / "bin", "transformer_qknorm")
    new.load_state_dict(state, strict=True, model_cfg=None)  # fairseq's load calls upgrade_state_dict
    assert torch.equal(new.decoder.output_bias, torch.zeros_like(new.decoder.output_bias))
    old.eval(), new.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        assert torch.equal(old(src, lengths, prev)[0], new(src, lengths, prev)[0])


@pytest.mark.parametrize("scheme, denom", [("xavier_normal", 2), ("smallinit", 5)])
def test_init_scheme_stds_follow_twt_section_3_1(tiny_data, scheme, denom):
    """TwT Eq. 4: std sqrt(2 / (d_in + d_out)); attention d_in = d_out = d (Xavier normal) or
    the FFN's d + 4d (SmallInit); FFN sqrt(2 / (d + d_ff)) in both."""
    dims = ["--encoder-embed-dim", "256", "--decoder-embed-dim", "256",
            "--encoder-ffn-embed-dim", "1024", "--decoder-ffn-embed-dim", "1024"]
    model, _ = build(tiny_data / "bin", "transformer_postnorm", "--init-scheme", scheme, *dims)
    d, d_ff = 256, 1024
    layer = model.decoder.layers[0]
    for proj in (layer.self_attn.q_proj, layer.encoder_attn.k_proj, model.encoder.layers[0].self_attn.out_proj):
        assert proj.weight.std().item() == pytest.approx(math.sqrt(2 / (denom * d)), rel=0.02)
        assert proj.weight.mean().abs().item() < 0.002
    assert layer.fc1.weight.std().item() == pytest.approx(math.sqrt(2 / (d + d_ff)), rel=0.02)


def _stock(data_bin, *extra):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(data_bin), "--arch", "transformer", *TINY_MODEL,
                                                "--share-all-embeddings", *extra])
    task = tasks.setup_task(args)
    torch.manual_seed(0)
    return task.build_model(args), task


def _loss_and_outputs(model, task, src, lengths, prev, target):
    model.train()
    torch.manual_seed(3)  # the same dropout masks in both models
    logits, _ = model(src, lengths, prev)
    lprobs = model.get_normalized_probs((logits, None), log_probs=True)
    loss = torch.nn.functional.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1),
                                        ignore_index=task.target_dictionary.pad())
    model.eval()
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out[:, -1])
    return loss, torch.stack(steps, 1)


@pytest.mark.parametrize("direction", ["stock_into_ours", "ours_into_stock"])
def test_qknorm_transformer_is_stock_fairseq(tiny_data, direction):
    ours, task = build(tiny_data / "bin", "qknorm_transformer", "--dropout", "0.2")
    stock, _ = _stock(tiny_data / "bin", "--dropout", "0.2")
    src, dst = (stock, ours) if direction == "stock_into_ours" else (ours, stock)
    dst.load_state_dict(src.state_dict(), strict=True)
    src_tokens, lengths, prev = batch(task)
    target = torch.cat([prev[:, 1:], torch.full((prev.size(0), 1), task.target_dictionary.eos())], 1)
    loss_a, dec_a = _loss_and_outputs(ours, task, src_tokens, lengths, prev, target)
    loss_b, dec_b = _loss_and_outputs(stock, task, src_tokens, lengths, prev, target)
    assert torch.allclose(loss_a, loss_b, rtol=0, atol=1e-6)
    assert torch.allclose(dec_a, dec_b, rtol=0, atol=1e-5)
    # and a training step changes both the same way
    for m in (ours, stock):
        m.zero_grad()
    loss_a.backward(), loss_b.backward()
    ga = dict(ours.named_parameters())["decoder.layers.0.self_attn.q_proj.weight"].grad
    gb = dict(stock.named_parameters())["decoder.layers.0.self_attn.q_proj.weight"].grad
    assert torch.allclose(ga, gb, atol=1e-6)
