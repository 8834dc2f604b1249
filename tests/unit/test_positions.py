"""--positions: the original code bases' fixed tables against a direct computation of their formula."""
import math

import numpy as np
import pytest
import torch

from helpers import batch, build


def original_formula(length, dim, odd_is_sin):
    """utils.get_positional_encoding of the TwT / QKNorm repositories, written out element by element."""
    table = np.zeros((length, dim))
    for n in range(length):
        for j in range(dim):
            angle = n * 10000.0 ** (-2.0 * (j // 2) / dim)
            table[n, j] = math.sin(angle) if j % 2 == 0 or odd_is_sin else math.cos(angle)
    return table


@pytest.mark.parametrize("kind", ["qknorm", "twt"])
def test_position_k_of_each_sentence_gets_row_k_of_the_original_table(tiny_data, kind):
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", kind)
    src, _, prev = batch(task, src_len=9)
    expected = torch.tensor(original_formula(40, 32, odd_is_sin=kind == "qknorm"), dtype=torch.float)
    for module, tokens in ((model.encoder, src), (model.decoder, prev)):
        got = module.embed_positions(tokens)
        for b in range(tokens.size(0)):
            real = (tokens[b] != task.source_dictionary.pad()).nonzero().flatten()  # sources are left-padded
            assert torch.allclose(got[b, real], expected[: len(real)], atol=1e-5)
            assert not got[b, tokens[b] == task.source_dictionary.pad()].any()


def test_the_qknorm_table_repeats_each_even_dimension():
    t = original_formula(10, 8, odd_is_sin=True)
    assert np.array_equal(t[:, 0::2], t[:, 1::2]) and not np.array_equal(t[:, 0::2], original_formula(10, 8, False)[:, 1::2])


def test_long_inputs_extend_the_original_table(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", "--positions", "qknorm",
                        "--max-source-positions", "8", "--max-target-positions", "8")
    tokens = torch.full((1, 20), task.source_dictionary.unk())
    got = model.encoder.embed_positions(tokens)
    assert torch.allclose(got[0], torch.tensor(original_formula(20, 32, True), dtype=torch.float), atol=1e-5)


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
