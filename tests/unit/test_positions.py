"""--positions: the plugin's position tables against the formulas of the papers and of fairseq,
written out here element by element."""
import math

import pytest
import torch

from helpers import batch, build


def vaswani(length, dim):
    """Vaswani et al. (2017) Sec. 3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(same)."""
    table = torch.zeros(length, dim)
    for pos in range(length):
        for i in range(dim // 2):
            table[pos, 2 * i] = math.sin(pos / 10000 ** (2 * i / dim))
            table[pos, 2 * i + 1] = math.cos(pos / 10000 ** (2 * i / dim))
    return table


def qknorm_code(length, dim):
    """The QKNorm repository's table: Vaswani's sines, repeated on the odd dimensions in place of cosines."""
    even = vaswani(length, dim)[:, 0::2]
    return torch.stack([even, even], dim=-1).reshape(length, dim)


def fairseq_table(length, dim, padding_idx=1):
    """fairseq's SinusoidalPositionalEmbedding: all sines, then all cosines, frequencies
    10000^(-i / (dim/2 - 1)), and a sentence's first token at position padding_idx + 1, not 0."""
    half = dim // 2
    table = torch.zeros(length, dim)
    for n in range(length):
        pos = n + padding_idx + 1
        for i in range(half):
            table[n, i] = math.sin(pos * 10000 ** (-i / (half - 1)))
            table[n, half + i] = math.cos(pos * 10000 ** (-i / (half - 1)))
    return table


TABLES = {"twt": vaswani, "qknorm": qknorm_code, "fairseq": fairseq_table}


@pytest.mark.parametrize("kind", ["qknorm", "twt", "fairseq"])
def test_position_k_of_each_sentence_gets_row_k_of_the_table(tiny_data, kind):
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", kind)
    src, _, prev = batch(task, src_len=9)
    assert task.source_dictionary.pad() == 1
    expected = TABLES[kind](40, 32)
    for module, tokens in ((model.encoder, src), (model.decoder, prev)):
        got = module.embed_positions(tokens)
        for b in range(tokens.size(0)):
            real = (tokens[b] != task.source_dictionary.pad()).nonzero().flatten()  # sources are left-padded
            assert torch.allclose(got[b, real], expected[: len(real)], atol=1e-5)
            assert not got[b, tokens[b] == task.source_dictionary.pad()].any()


def test_the_three_flags_give_three_different_tables(tiny_data):
    """What the model adds under each --positions differs from the others' (qknorm: odd dimensions
    repeat the even ones; fairseq's orders and spaces its frequencies otherwise), so the test above
    tells them apart."""
    tables = {}
    for kind in TABLES:
        model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", kind)
        tables[kind] = model.encoder.embed_positions(torch.full((1, 10), task.source_dictionary.unk()))[0]
    kinds = list(tables)
    for i, a in enumerate(kinds):
        for b in kinds[i + 1:]:
            assert not torch.allclose(tables[a], tables[b], atol=0.1), (a, b)


def test_long_inputs_extend_the_original_table(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", "qknorm",
                        "--max-source-positions", "8", "--max-target-positions", "8")
    tokens = torch.full((1, 20), task.source_dictionary.unk())
    got = model.encoder.embed_positions(tokens)
    assert torch.allclose(got[0], qknorm_code(20, 32), atol=1e-5)


@pytest.mark.parametrize("kind", ["fairseq", "qknorm"])
def test_incremental_decoding_uses_the_same_positions(tiny_data, kind):
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", kind)
    model.eval()
    src, lengths, prev = batch(task)
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        full, _ = model.decoder(prev, encoder_out=enc)
        state = {}
        steps = [model.decoder(prev[:, : t + 1], encoder_out=enc, incremental_state=state)[0][:, -1]
                 for t in range(prev.size(1))]
    finite = torch.isfinite(full)
    assert torch.allclose(full[finite], torch.stack(steps, 1)[finite], atol=1e-4)


def test_the_default_is_fairseqs_table(tiny_data):
    from fairseq.modules import SinusoidalPositionalEmbedding

    from qknorm_fairseq.positions import OriginalPositions

    model, _ = build(tiny_data / "bin", "transformer_qknorm")
    assert type(model.encoder.embed_positions) is SinusoidalPositionalEmbedding
    model, _ = build(tiny_data / "bin", "transformer_qknorm", "--positions", "twt")
    assert isinstance(model.decoder.embed_positions, OriginalPositions)
