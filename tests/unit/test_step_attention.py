"""--fused-kernels' attention of a decoding step on a CPU (csrc/step_attention.c): the formula in fp64 through the
strides a decoder cache hands it, a mask's -inf keys left out, the same bits on one thread and two; what it does
not take left to torch's kernels; and a model decoding through it: the cached step and fairseq's incremental step
still give the same log-probabilities bit for bit, close to the kernels' without it."""
import pytest
import torch

from qknorm_fairseq import native, step_attention
from qknorm_fairseq.decoder_cache import DecoderCache

from helpers import build, on_threads

pytestmark = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")


def _reference(q, k, v, mask, scale):
    s = scale * q.double() @ k.double().transpose(-1, -2)
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v.double()


def _cache_view(dtype, rows=7, heads=3, d=40, steps=21, capacity=32, g=None):
    """Queries, keys and values as the decoder cache hands them over: one query a row, selected out of the
    projections, the keys and values a view of the first STEPS positions of a larger buffer."""
    buf = torch.randn(rows, 2, 2, heads, capacity, d, generator=g).to(dtype)
    q = torch.randn(rows, 3, heads, d, generator=g).to(dtype).select(1, 0).unsqueeze(2)
    return q, buf[:, 1, 0, :, :steps], buf[:, 1, 1, :, :steps]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_cache_views_attention_is_the_formula_in_fp64(dtype):
    """Keys of 40 values (two vectors of 16 lanes and a tail), 21 keys (a block of 16 and one of 5), strided views:
    to fp32's rounding, or half a bf16 step of the output's magnitude; 1 and 2 threads the same bits."""
    g = torch.Generator().manual_seed(0)
    q, k, v = _cache_view(dtype, g=g)
    assert not k.is_contiguous() and not q.is_contiguous() and step_attention.fits(q, k, v, None)
    outs = [on_threads(t, step_attention.attention, q, k, v, None, 0.7) for t in (1, 2)]
    assert torch.equal(*outs) and outs[0].dtype == dtype and outs[0].is_contiguous()
    ref = _reference(q, k, v, None, 0.7)
    tol = 2e-6 if dtype == torch.float32 else 2 ** -8
    assert (outs[0].double() - ref).abs().max() <= tol * ref.abs().max()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_masked_keys_get_no_weight(dtype):
    """A sentence's beams as its queries over its source, padded keys -inf in the additive mask (batch, 1, 1, keys):
    the output is the attention over the unpadded keys alone; a row with every key masked is NaN, as in torch."""
    g = torch.Generator().manual_seed(1)
    sentences, heads, beams, keys, d = 5, 2, 4, 19, 16
    q, k, v = (torch.randn(sentences, heads, n, d, generator=g).to(dtype) for n in (beams, keys, keys))
    pad = torch.zeros(sentences, keys, dtype=torch.bool)
    pad[1, -6:] = True
    pad[3] = True
    mask = torch.zeros(sentences, keys, dtype=dtype).masked_fill(pad, float("-inf"))[:, None, None, :]
    out = step_attention.attention(q, k, v, mask, 0.25)
    alone = step_attention.attention(q[1:2], k[1:2, :, :13], v[1:2, :, :13], None, 0.25)
    assert torch.equal(out[1], alone[0])
    assert torch.isnan(out[3]).all() and not torch.isnan(out[[0, 1, 2, 4]]).any()
    ref = _reference(q, k, v, mask, 0.25)
    tol = 2e-6 if dtype == torch.float32 else 2 ** -8
    keep = [0, 1, 2, 4]
    assert (out[keep].double() - ref[keep]).abs().max() <= tol * ref[keep].abs().max()
    # the softmax itself, asked for: the output the same bits, the weights fp32, 0 on the padded keys
    again, weights = step_attention.attention(q, k, v, mask, 0.25, with_weights=True)
    assert torch.equal(again[keep], out[keep]) and weights.dtype == torch.float32
    assert weights.shape == (sentences, heads, beams, keys)
    probs = torch.softmax(0.25 * q.double() @ k.double().transpose(-1, -2) + mask.double(), -1)
    assert (weights[keep].double() - probs[keep]).abs().max() <= 2e-6
    assert (weights[1, ..., -6:] == 0).all() and torch.isnan(weights[3]).all()


def test_what_the_loop_does_not_take():
    q, k, v = _cache_view(torch.float32)
    assert step_attention.fits(q, k, v, None)
    many = torch.randn(q.size(0), q.size(1), step_attention.MAX_QUERIES + 1, q.size(3))
    assert not step_attention.fits(many, k, v, None)  # a whole sentence's queries: torch's products
    assert not step_attention.fits(q.double(), k.double(), v.double(), None)
    assert not step_attention.fits(q, k.bfloat16(), v, None)
    assert not step_attention.fits(q, k.transpose(-1, -2).contiguous().transpose(-1, -2), v, None)
    assert not step_attention.fits(q, k, v, torch.zeros(k.size(2), dtype=torch.bfloat16))
    assert step_attention.fits(q, k, v, torch.zeros(q.size(0), 1, 1, k.size(2)))
    assert not step_attention.fits(q, k, v, torch.zeros(q.size(0) + 1, 1, 1, k.size(2)))  # does not broadcast
    with native.enabled(False):
        assert not step_attention.fits(q, k, v, None)


def _counting(monkeypatch):
    calls = []
    original = step_attention.attention
    monkeypatch.setattr(step_attention, "attention", lambda *a, **kw: calls.append(a[0].size(2)) or original(*a, **kw))
    return calls


def _decode(model, task, steps=9, beam=3, seed=0):
    """Each step's log-probabilities from fairseq's incremental path and from the cached step, the same parents,
    and the last layer's cross-attention weights fairseq's path returns (averaged over the heads)."""
    g = torch.Generator().manual_seed(seed)
    model.decoder.set_beam_size(beam)
    d = task.source_dictionary
    src = torch.cat([torch.full((2, 1), d.pad()), torch.randint(d.nspecial, len(d), (2, 6), generator=g),
                     torch.full((2, 1), d.eos())], 1)
    src[1, :3] = d.pad()  # fairseq pads on the left
    rows = torch.arange(2).repeat_interleave(beam)
    fairseq_steps, cached_steps, weights = [], [], []
    with torch.no_grad():
        enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=torch.tensor([7, 4])), rows)
        cache, state = DecoderCache(model, enc), {}
        tokens = torch.full((len(rows), 1), task.target_dictionary.eos())
        for _ in range(steps):
            out, extra = model.decoder(tokens, encoder_out=enc, incremental_state=state)
            weights.append(extra["attn"][0][:, -1])
            fairseq_steps.append(model.get_normalized_probs((out[:, -1:], None), log_probs=True)[:, -1])
            cached_steps.append(cache.step(tokens))
            order = torch.arange(2).repeat_interleave(beam) * beam + torch.randint(0, beam, (len(rows),), generator=g)
            model.decoder.reorder_incremental_state_scripting(state, order)
            enc = model.encoder.reorder_encoder_out(enc, order)
            cache.reorder(order)
            tokens = torch.cat([tokens[order], torch.randint(4, len(task.target_dictionary), (len(rows), 1),
                                                             generator=g)], 1)
    return torch.stack(fairseq_steps), torch.stack(cached_steps), torch.stack(weights)


@pytest.mark.parametrize("arch", ["transformer_qknorm", "transformer_prenorm"])
def test_a_model_decodes_through_the_loop_with_either_step(tiny_data, arch, monkeypatch):
    """QKNorm (g folded into the queries) and scaled dot products; fairseq's step and the cached one give the same
    bits through the loop, and they are those of the model without it to fp32 rounding."""
    calls = _counting(monkeypatch)  # before the model binds the function
    fused, task = build(tiny_data / "bin", arch, "--decoder-layers", "2", "--fused-kernels")
    plain, _ = build(tiny_data / "bin", arch, "--decoder-layers", "2")
    for m in (fused, plain):
        m.eval()
        m.make_generation_fast_()  # only the last layer's cross-attention asks for weights (computed apart)
    fairseq_lp, cached_lp, weights = _decode(fused, task)
    assert set(calls) == {1, 3}  # self-attention's one query, cross-attention's three beams; the encoder stays
    # both steps, 9 steps each: 2 self-attentions and 2 cross-attentions, the last one's too, whose weights
    # fairseq's step asks for (the cached step does not read them)
    assert len(calls) == 2 * 9 * 4
    assert torch.equal(fairseq_lp, cached_lp)
    calls.clear()
    expected, _, expected_weights = _decode(plain, task)
    assert not calls
    assert torch.allclose(cached_lp, expected, rtol=0, atol=1e-5)
    assert weights.shape == expected_weights.shape == (9, 6, 8)  # steps, rows, source positions
    assert torch.allclose(weights, expected_weights, rtol=0, atol=1e-6)
    assert (weights[:, 3:, :3] == 0).all()  # the second sentence's left padding
