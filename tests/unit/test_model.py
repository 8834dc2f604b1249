"""The qknorm_transformer model and its presets, built in-process from real fairseq arguments."""
import math
import re

import numpy as np
import pytest
import torch
from fairseq import options, tasks

from qknorm_fairseq.architectures import PRESETS as ARCHS
from qknorm_fairseq.attention import NormAttention
from qknorm_fairseq.norms import RMSNorm, ScaleNorm

from helpers import REPO, TINY_MODEL, USER_DIR, batch, build


def test_readme_table_lists_every_preset():
    # one list of presets: the registered ones (architectures.PRESETS) are the README's table, in order
    text = open(f"{REPO}/README.md", encoding="utf-8").read()
    table = text.split("## Architectures")[1].split("\n#")[0]
    assert re.findall(r"^\| `(\w+)` \|", table, re.M) == list(ARCHS)


def test_readme_flags_table_names_every_model_flag():
    # every flag of QKNormConfig (and its --no- form for a boolean) is in the README's flags table
    from qknorm_fairseq.config import FLAGS

    text = open(f"{REPO}/README.md", encoding="utf-8").read()
    table = text.split("| flag | meaning | default |")[1].split("\n\n")[0]
    named = set()
    for flag in re.findall(r"--[\w{},-]+", table):
        braces = re.fullmatch(r"--\{([\w,]+)\}(-[\w-]+)", flag)
        named |= {f"--{a}{braces[2]}" for a in braces[1].split(",")} if braces else {flag}
    missing = [f.name for f in FLAGS if "--" + f.name.replace("_", "-") not in named]
    assert not missing, f"README's flags table lacks {missing}"


def full_and_stepwise(model, src, lengths, prev):
    """The decoder's logits (eval mode) in one pass and one step at a time, as beam search runs it."""
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state, steps = {}, []
        for t in range(prev.size(1)):
            out, _ = model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)
            steps.append(out[:, -1])
    return full, torch.stack(steps, dim=1)


@pytest.mark.parametrize("arch", ARCHS)
def test_incremental_decoding_matches_full_forward(tiny_data, arch):
    model, task = build(tiny_data / "bin", arch)
    model.eval()
    full, step = full_and_stepwise(model, *batch(task))
    assert torch.equal(torch.isinf(full), torch.isinf(step))
    finite = torch.isfinite(full)
    assert finite.any()
    assert torch.allclose(full[finite], step[finite], atol=1e-4)


@pytest.mark.parametrize("arch", ["transformer_qknorm", "transformer_postnorm"])
def test_beam_search_state_reordering(tiny_data, arch):
    """Cross-attention keeps one copy of the source per sentence when beam > 1 (as fairseq does)."""
    model, task = build(tiny_data / "bin", arch)
    model.eval()
    src, lengths, prev = batch(task, bsz=2)
    beam = 3
    order = torch.arange(2).repeat_interleave(beam)
    with torch.no_grad():
        enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths), order)
        prev = prev[order]
        prev[:, 1:] = torch.randint(task.target_dictionary.nspecial, len(task.target_dictionary), prev[:, 1:].shape)
        full, _ = model.decoder(prev, encoder_out=enc)
        model.decoder.set_beam_size(beam)
        state = {}
        perm = torch.tensor([2, 0, 1, 5, 3, 4])  # reorder hypotheses within each sentence's beam
        out0, _ = model.decoder(prev[:, :1], encoder_out=enc, incremental_state=state)
        model.decoder.reorder_incremental_state_scripting(state, perm)
        prev2 = torch.cat([prev[perm, :1], prev[:, 1:2]], dim=1)
        out1, _ = model.decoder(prev2, encoder_out=enc, incremental_state=state)
        ref, _ = model.decoder(prev2, encoder_out=enc)
    finite = torch.isfinite(ref[:, -1])
    assert torch.allclose(out1[:, -1][finite], ref[:, -1][finite], atol=1e-4)
    assert torch.allclose(out0[:, 0][torch.isfinite(out0[:, 0])], full[:, 0][torch.isfinite(full[:, 0])], atol=1e-4)


def test_custom_attention_runs_in_all_three_places(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm")
    model.eval()
    src, lengths, prev = batch(task)
    sites = {"encoder self": [layer.self_attn for layer in model.encoder.layers],
             "decoder self": [layer.self_attn for layer in model.decoder.layers],
             "cross": [layer.encoder_attn for layer in model.decoder.layers]}
    with torch.no_grad():
        base, _ = model(src, lengths, prev)
        for name, mods in sites.items():
            assert all(isinstance(m, NormAttention) for m in mods)
            calls = []
            hooks = [m.register_forward_hook(lambda *a, calls=calls: calls.append(1)) for m in mods]
            old = [m.qk_scale.item() for m in mods]
            for m in mods:
                m.qk_scale.fill_(0.5)
            changed, _ = model(src, lengths, prev)
            for m, g in zip(mods, old):
                m.qk_scale.fill_(g)
            for h in hooks:
                h.remove()
            assert len(calls) == len(mods), name
            fin = torch.isfinite(base)
            assert not torch.allclose(base[fin], changed[fin]), f"g of {name} attention has no effect"


def test_qknorm_g0_from_binarized_lengths(tiny_data):
    lengths = []
    for side in ("src", "tgt"):
        with open(tiny_data / f"raw/train.{side}") as f:
            lengths += [len(line.split()) + 1 for line in f]  # + EOS
    lengths.sort()
    # 97.5th percentile with linear interpolation, by hand
    pos = 0.975 * (len(lengths) - 1)
    lo = int(math.floor(pos))
    L = lengths[lo] + (pos - lo) * (lengths[min(lo + 1, len(lengths) - 1)] - lengths[lo])
    g0 = math.log2(L * L - L)
    model, _ = build(tiny_data / "bin", "transformer_qknorm")
    scales = [m.qk_scale.item() for m in model.modules() if isinstance(m, NormAttention)]
    assert len(scales) == 6 and all(math.isclose(s, g0, rel_tol=1e-6) for s in scales)
    model, _ = build(tiny_data / "bin", "transformer_qknorm", "--qknorm-length", "79")
    assert math.isclose(model.encoder.layers[0].self_attn.qk_scale.item(), math.log2(79 * 78), rel_tol=1e-6)
    assert math.isclose(math.log2(79 * 78), 12.59, abs_tol=0.005)  # the QKNorm paper's gl->en value
    model, _ = build(tiny_data / "bin", "transformer_qknorm", "--qknorm-g0", "7.5")
    assert model.decoder.layers[1].encoder_attn.qk_scale.item() == 7.5


def test_g0_and_the_mask_come_from_the_training_data_as_fairseq_finds_it(tiny_data, tmp_path, caplog):
    """Data binarized the other way round (train.tgt-src.*, which fairseq's translation task reads too) gives the
    same g0 and mask; a training with no binarized train split is refused, naming the fix (translation_qk), while
    a model built to load a checkpoint into keeps the checkpoint's."""
    pair = ["--task", "translation_qk", "--source-lang", "src", "--target-lang", "tgt"]
    ref, _ = build(tiny_data / "bin", "transformer_qknorm", *pair)
    reverse = tmp_path / "reverse"
    reverse.mkdir()
    for f in (tiny_data / "bin").iterdir():
        (reverse / f.name.replace("src-tgt", "tgt-src")).write_bytes(f.read_bytes())
    model, _ = build(reverse, "transformer_qknorm", *pair)
    assert model.args.qknorm_g0 == ref.args.qknorm_g0 != 1.0
    assert torch.equal(model.decoder.allowed_types, ref.decoder.allowed_types) and not ref.decoder.allowed_types.all()
    for f in reverse.glob("train.*"):
        f.unlink()
    with pytest.raises(ValueError, match=r"no binarized train split \(train\.src-tgt\.src\.idx or train\.tgt-src\.src\.idx\) "
                                         r"in .*: QKNorm's g0 comes from its lengths; binarize it \(fairseq-preprocess\), "
                                         r"or give --qknorm-length L or --qknorm-g0 G"):
        build(reverse, "transformer_qknorm", *pair)
    with pytest.raises(ValueError, match=r"no binarized train split .*: the target vocabulary mask \(--target-vocab-mask\) "
                                         r"comes from its target side; binarize it .*, or add --no-target-vocab-mask"):
        build(reverse, "transformer_qknorm", *pair, "--qknorm-g0", "5")
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(reverse), "--user-dir", USER_DIR, *pair, "--arch", "transformer_qknorm", *TINY_MODEL,
        "--share-all-embeddings", "--criterion", "masked_label_smoothed_cross_entropy"])
    with caplog.at_level("WARNING"):
        loaded = tasks.setup_task(args).build_model(args, from_checkpoint=True)
    assert loaded.args.qknorm_g0 == 1.0 and loaded.decoder.allowed_types.all()
    assert "QKNorm g0 left at 1.0 (the checkpoint's g will be loaded)" in caplog.text


def test_a_training_widens_a_loaded_mask_by_its_targets_and_decoding_keeps_it(tiny_data):
    """translation_qk's training (resumed or fine-tuned) keeps its training targets' types allowed over a
    checkpoint's mask; a model built to decode a checkpoint takes the checkpoint's mask as it is."""
    pair = ["--task", "translation_qk"]
    model, task = build(tiny_data / "bin", "transformer_qknorm", *pair)
    allowed = model.decoder.allowed_types.clone()
    trained_on, other = int(allowed.nonzero()[-1]), int((~allowed).nonzero()[-1])
    loaded = allowed.clone()
    loaded[trained_on], loaded[other] = False, True
    model.load_state_dict({**model.state_dict(), "decoder.allowed_types": loaded.clone()})
    assert torch.equal(model.decoder.allowed_types, allowed | loaded)
    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(tiny_data / "bin"), "--user-dir", USER_DIR, *pair, "--arch", "transformer_qknorm", *TINY_MODEL,
        "--share-all-embeddings", "--criterion", "masked_label_smoothed_cross_entropy"])
    decoding = tasks.setup_task(args).build_model(args, from_checkpoint=True)
    decoding.load_state_dict({**model.state_dict(), "decoder.allowed_types": loaded.clone()})
    assert torch.equal(decoding.decoder.allowed_types, loaded)


def test_target_vocab_mask(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_fixnorm")
    d = task.target_dictionary
    with open(tiny_data / "raw/train.tgt") as f:
        seen = {d.index(w) for line in f for w in line.split()}
    allowed = set(np.flatnonzero(model.decoder.allowed_types.numpy()).tolist())
    assert allowed == seen | {d.eos()}
    model.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        logits, _ = model(src, lengths, prev)
    assert torch.isinf(logits[..., ~model.decoder.allowed_types]).all()
    assert torch.isfinite(logits[..., model.decoder.allowed_types]).all()


def test_word_dropout_replaces_only_ordinary_tokens(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_prenorm", "--word-dropout", "0.5")
    d = task.source_dictionary
    tokens = torch.randint(d.nspecial, len(d), (200, 50))
    tokens[:, 0], tokens[:, -1], tokens[:, 1] = d.pad(), d.eos(), d.unk()
    dropped = model.drop_words(tokens)
    changed = dropped != tokens
    assert torch.all(dropped[changed] == d.unk())
    assert not changed[:, [0, -1]].any()
    assert 0.45 < changed[:, 2:-1].float().mean().item() < 0.55
    model.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        a, _ = model(src, lengths, prev)
        b, _ = model(src, lengths, prev)
    assert torch.equal(a, b), "no word dropout at inference"


def test_word_dropout_specials_is_the_original_codes_every_non_pad_token(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_prenorm", "--word-dropout", "0.5", "--word-dropout-specials")
    d = task.source_dictionary
    tokens = torch.randint(d.nspecial, len(d), (400, 50))
    tokens[:, 0], tokens[:, 1], tokens[:, -1] = d.pad(), d.bos(), d.eos()
    dropped = model.drop_words(tokens)
    changed = dropped != tokens
    assert torch.all(dropped[changed] == d.unk()) and not changed[:, 0].any(), "padding stays"
    for column in (1, -1):  # BOS and EOS, each replaced about half the time
        assert 0.4 < changed[:, column].float().mean().item() < 0.6


def test_word_dropout_specials_needs_word_dropout(tiny_data):
    with pytest.raises(ValueError, match=r"--word-dropout-specials has no effect without --word-dropout P"):
        build(tiny_data / "bin", "transformer_prenorm", "--word-dropout", "0", "--word-dropout-specials")


def test_language_embeddings_add_one_learned_vector_a_side(tiny_data):
    """--language-embeddings: the encoder's input is fairseq's (scaled tokens + positions) plus the
    source vector at every position, the decoder's plus the target vector (eval mode, so no
    dropout); the vectors start N(0, 1/d), learn, and decode step by step as in one pass."""
    torch.manual_seed(0)
    on, task = build(tiny_data / "bin", "transformer_scalenorm", "--language-embeddings")
    off, _ = build(tiny_data / "bin", "transformer_scalenorm")
    v_src, v_tgt = on.encoder.embed_positions.language, on.decoder.embed_positions.language
    assert v_src.shape == v_tgt.shape == (32,) and not torch.equal(v_src, v_tgt)
    wide, _ = build(tiny_data / "bin", "transformer_scalenorm", "--language-embeddings", "--encoder-embed-dim", "256",
                    "--decoder-embed-dim", "256")
    variance = wide.encoder.embed_positions.language.square().mean().item()
    assert 0.7 / 256 < variance < 1.3 / 256, variance  # N(0, d^-0.5): variance 1/d
    on.load_state_dict({**off.state_dict(), "encoder.embed_positions.language": v_src.detach(),
                        "decoder.embed_positions.language": v_tgt.detach()}, strict=False)
    on.eval(), off.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        x_on, _ = on.encoder.forward_embedding(src)
        x_off, _ = off.encoder.forward_embedding(src)
        assert torch.allclose(x_on - x_off, v_src.expand_as(x_on), atol=1e-6)
    full, step = full_and_stepwise(on, src, lengths, prev)
    with torch.no_grad():
        kept = on.decoder.embed_positions.language.clone()
        on.decoder.embed_positions.language.zero_()
        no_target_vector, _ = on.decoder(prev, encoder_out=on.encoder(src, src_lengths=lengths))
        on.decoder.embed_positions.language.copy_(kept)
    finite = torch.isfinite(full)
    assert torch.allclose(full[finite], step[finite], atol=1e-4)
    assert not torch.allclose(full[finite], no_target_vector[finite], atol=1e-4), "the decoder adds its vector"
    on.train()
    logits, _ = on(src, lengths, prev)
    logits[torch.isfinite(logits)].sum().backward()
    assert v_src.grad.abs().sum() > 0 and v_tgt.grad.abs().sum() > 0


def test_language_embeddings_need_positions(tiny_data):
    with pytest.raises(ValueError, match="--language-embeddings adds its vector where fairseq adds positions"):
        build(tiny_data / "bin", "transformer_prenorm", "--language-embeddings", "--no-token-positional-embeddings")


def test_norm_types_and_placement(tiny_data):
    model, _ = build(tiny_data / "bin", "transformer_postnorm")
    assert model.encoder.layer_norm is None and not model.encoder.layers[0].normalize_before
    # a PreNorm preset made PostNorm on one side by fairseq's flag's negation (PostNorm + FixNorm + ScaleNorm)
    model, _ = build(tiny_data / "bin", "transformer_scalenorm", "--no-encoder-normalize-before")
    assert model.encoder.layer_norm is None and not model.encoder.layers[0].normalize_before
    assert model.decoder.layer_norm is not None and model.decoder.layers[0].normalize_before
    assert type(model.encoder.layers[0].final_layer_norm) is ScaleNorm
    assert type(model.encoder.embed_tokens).__name__ == "FixNormEmbedding"
    model, _ = build(tiny_data / "bin", "transformer_scalenorm")
    norms = [m for m in model.modules() if isinstance(m, ScaleNorm)]
    # 2 per encoder layer, 3 per decoder layer, 2 final norms
    assert len(norms) == 2 * 2 + 2 * 3 + 2 and all(isinstance(n.g, torch.nn.Parameter) for n in norms)
    model, _ = build(tiny_data / "bin", "transformer_scalenorm_fixed_g")
    learned = [n for n, p in model.named_parameters() if n.endswith(".g")]
    assert learned == ["decoder.layer_norm.g"]
    model, _ = build(tiny_data / "bin", "transformer_rmsnorm")
    assert sum(isinstance(m, RMSNorm) for m in model.modules()) == 12
    model, _ = build(tiny_data / "bin", "transformer_hnas")
    assert [layer.self_attn.weights for layer in model.encoder.layers] == ["hnas", "hnas"]
    assert model.decoder.layers[0].self_attn.weights == "softmax"


@pytest.mark.parametrize("flags,message", [
    (["--decoder-attention", "dnas"], "use them in --encoder-attention only"),
    (["--cross-attention", "qknorm+hnas"], "future target tokens"),
    (["--encoder-attention", "qknorm", "--qknorm-p", "0.5"], "not a norm for p < 1"),
    (["--qknorm-length", "1"], "needs L > 1"),
    (["--packed-decoder", "--packed-groups", "0"], "--packed-groups 0: the packed decoder's attention runs in 1, 2 or 3 groups"),
    (["--packed-decoder", "--packed-groups", "4"], "--packed-groups 4: .* use one of those"),
])
def test_invalid_combinations(tiny_data, flags, message):
    with pytest.raises(ValueError, match=message):
        build(tiny_data / "bin", "transformer_qknorm", *flags)


@pytest.mark.parametrize("arch,flags,message", [
    ("transformer_rmsnorm", ["--scalenorm-fixed-g"], "--scalenorm-fixed-g has no effect without --norm-type scalenorm"),
    ("transformer_prenorm", ["--qknorm-p", "3"], "--qknorm-p has no effect without a QKNorm attention"),
    ("transformer_hnas", ["--qknorm-g0", "5"], "--qknorm-g0 has no effect without a QKNorm attention"),
    ("transformer_qknorm", ["--packed-groups", "2"], "--packed-groups has no effect without --packed-decoder"),
])
def test_flags_without_effect_are_rejected(tiny_data, arch, flags, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        build(tiny_data / "bin", arch, *flags)


def test_the_resolved_g0_is_the_declared_flag(tiny_data):
    # the scripts give every system the paper's L, QKNorm or not
    build(tiny_data / "bin", "transformer_prenorm", "--qknorm-length", "79")
    model, _ = build(tiny_data / "bin", "transformer_qknorm", "--qknorm-length", "79")
    assert model.args.qknorm_g0 == pytest.approx(math.log2(79 * 78)) and not hasattr(model.args, "qknorm_g0_value")


def test_fixnorm_needs_shared_embeddings(tiny_data):
    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, [str(tiny_data / "bin"), "--user-dir", USER_DIR, "--arch",
                                                "qknorm_transformer", "--fixnorm", *TINY_MODEL])
    with pytest.raises(ValueError, match="--share-all-embeddings"):
        tasks.setup_task(args).build_model(args)


@pytest.mark.parametrize("stock", ["label_smoothed_cross_entropy", "label_smoothed_cross_entropy_with_alignment"])
def test_target_mask_rejects_stock_label_smoothing(tiny_data, stock):
    with pytest.raises(ValueError, match=f"fairseq's label smoothing \\(--criterion {stock}\\), which then sums them: "
                                         "use --criterion masked_label_smoothed_cross_entropy"):
        build(tiny_data / "bin", "transformer_prenorm", "--criterion", stock)


@pytest.mark.parametrize("arch", ARCHS)
def test_every_parameter_gets_a_gradient(tiny_data, arch):
    # PyTorch's DistributedDataParallel (fairseq's default --ddp-backend on GPUs) fails at the
    # second step when a parameter takes no part in the loss (find_unused_parameters is off).
    model, task = build(tiny_data / "bin", arch)
    src, lengths, prev = batch(task)
    out, _ = model(src, lengths, prev)
    out.float().logsumexp(-1).sum().backward()
    unused = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum())]
    assert unused == []
