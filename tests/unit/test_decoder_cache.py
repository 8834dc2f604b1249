"""The cached decoder step (qknorm_fairseq/decoder_cache.py) against fairseq's incremental path: the
same log-probabilities bit for bit at every step, through reorders, sentences leaving the batch and the
buffer's growth; its cache written and reordered in place; both searches' hypotheses unchanged."""
import argparse
import logging

import pytest
import torch

from qknorm_fairseq import decoder_cache
from qknorm_fairseq.decoder_cache import CachedEnsemble, DecoderCache, unsupported
from qknorm_fairseq.task import DECODER_STEPS, GNMTSequenceGenerator, TranslationQKConfig, TranslationQKTask
from qknorm_fairseq.twt_search import TwTSequenceGenerator
from qknorm_pipeline.benchmark import validation
from qknorm_pipeline.benchmark.step_profile import SYNCS

from helpers import build

# every attention of the decoder: softmax over dot products, QKNorm (p = 2), Lp-QKNorm (p = 4); pre-
# and post-norm; LayerNorm, ScaleNorm, RMSNorm; HNAS in the encoder
PRESETS = ["transformer_qknorm", "transformer_lpqknorm", "transformer_postnorm", "transformer_prenorm",
           "transformer_scalenorm", "transformer_rmsnorm", "transformer_hnas"]


def _model(tiny_data, arch, generation, *extra):
    model, task = build(tiny_data / "bin", arch, "--decoder-layers", "3", *extra)
    model.eval()
    if generation:
        model.make_generation_fast_()  # as fairseq-generate: no cross-attention weights but the last layer's
    return model, task


def _source(task, lengths, seed=1):
    d = task.source_dictionary
    g = torch.Generator().manual_seed(seed)
    width = max(lengths) + 1
    src = torch.full((len(lengths), width), d.pad())
    for i, n in enumerate(lengths):  # fairseq pads sources on the left
        src[i, width - n - 1:] = torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])])
    return src, torch.tensor(lengths) + 1


def _parents(sentences, beam, g):
    """Each row's parent: a random row of its own sentence."""
    return (torch.arange(sentences).repeat_interleave(beam) * beam + torch.randint(0, beam, (sentences * beam,),
                                                                                   generator=g))


@pytest.mark.parametrize("generation", [False, True], ids=["validation", "generate"])
@pytest.mark.parametrize("arch", PRESETS)
def test_log_probs_equal_fairseqs_incremental_path_bit_for_bit(tiny_data, arch, generation, monkeypatch):
    monkeypatch.setattr(decoder_cache, "FIRST_POSITIONS", 4)  # the buffer grows twice in 12 steps
    model, task = _model(tiny_data, arch, generation)
    beam, steps, g = 3, 12, torch.Generator().manual_seed(0)
    model.decoder.set_beam_size(beam)
    src, lengths = _source(task, [3, 7, 5])
    rows = torch.arange(3).repeat_interleave(beam)
    with torch.no_grad():
        enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths), rows)
        cache, state = DecoderCache(model, enc), {}
        tokens = torch.full((len(rows), 1), task.target_dictionary.eos())
        for t in range(steps):
            out, _ = model.decoder(tokens, encoder_out=enc, incremental_state=state)
            expected = model.get_normalized_probs((out[:, -1:], None), log_probs=True)[:, -1]
            assert torch.equal(cache.step(tokens), expected), f"{arch}: step {t} differs"
            sentences = tokens.size(0) // beam
            order = _parents(sentences, beam, g)
            if t == 5:  # the second sentence leaves the batch
                order = order.view(sentences, beam)[[0, 2]].view(-1)
            model.decoder.reorder_incremental_state_scripting(state, order)
            enc = model.encoder.reorder_encoder_out(enc, order)
            cache.reorder(order)
            tokens = torch.cat([tokens[order], torch.randint(4, len(task.target_dictionary), (len(order), 1),
                                                             generator=g)], 1)
    assert cache.shape[3] == 16 and cache.rows == 2 * beam


@pytest.mark.parametrize("moved_only", [True, False], ids=["cpu-reorder", "gpu-reorder"])
def test_keys_and_values_are_written_and_reordered_in_place(tiny_data, moved_only, monkeypatch):
    monkeypatch.setattr(decoder_cache, "moved_rows_only", lambda device: moved_only)
    model, task = _model(tiny_data, "transformer_qknorm", generation=False)
    beam, g = 2, torch.Generator().manual_seed(3)
    model.decoder.set_beam_size(beam)
    src, lengths = _source(task, [4, 6])
    with torch.no_grad():
        enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths),
                                                torch.arange(2).repeat_interleave(beam))
        cache = DecoderCache(model, enc)
        cache.kv.fill_(float("nan"))  # not the memory of an earlier cache that held the same values
        buffer = cache.kv.data_ptr()
        tokens = torch.full((4, 1), task.target_dictionary.eos())
        for t in range(3):
            before = cache.view().clone()
            cache.step(tokens)
            after = cache.view()
            # a step writes position t of every layer, in place, and leaves the earlier positions
            assert torch.equal(after[..., :t, :], before[..., :t, :])
            assert not torch.equal(after[..., t, :], before[..., t, :])
            order = _parents(2, beam, g)
            cache.reorder(order)
            assert torch.equal(cache.view()[..., :t + 1, :], after[order, ..., :t + 1, :])
            tokens = torch.cat([tokens[order], torch.full((4, 1), 5)], 1)
        assert cache.kv.data_ptr() == buffer  # no buffer allocated after the first
        # the keys in the buffer are QKNorm's normalised keys of the layer's own projection
        keys = cache.view()[:, 0, 0, :, :3]
        assert torch.allclose(keys.norm(dim=-1), torch.ones(keys.shape[:-1]), atol=1e-6)


def test_a_gpu_reorder_reads_nothing_from_the_device(tiny_data, monkeypatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            names.append(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    model, task = _model(tiny_data, "transformer_qknorm", generation=False)
    model.decoder.set_beam_size(2)
    src, lengths = _source(task, [4, 6])
    assert decoder_cache.moved_rows_only(torch.device("cpu")) and not decoder_cache.moved_rows_only(torch.device("cuda"))
    for moved_only, reads in ((True, ["nonzero"]), (False, [])):
        monkeypatch.setattr(decoder_cache, "moved_rows_only", lambda device, moved_only=moved_only: moved_only)
        with torch.no_grad():
            enc = model.encoder.reorder_encoder_out(model.encoder(src, src_lengths=lengths), torch.arange(2).repeat_interleave(2))
            cache = DecoderCache(model, enc)
            cache.step(torch.full((4, 1), task.target_dictionary.eos()))
            names = []
            with Ops():
                cache.reorder(torch.tensor([1, 1, 2, 3]))
        # nonzero: a data-dependent shape, a host-device sync on a GPU (step_profile's SYNCS)
        assert [n for n in names if n in SYNCS] == reads


def test_the_source_is_projected_once_per_batch(tiny_data):
    model, task = _model(tiny_data, "transformer_qknorm", generation=False)
    model.decoder.set_beam_size(2)
    calls = []
    for layer in model.decoder.layers:
        layer.encoder_attn.k_proj.register_forward_hook(lambda *a: calls.append("k"))
        layer.encoder_attn.v_proj.register_forward_hook(lambda *a: calls.append("v"))
    src, lengths = _source(task, [4, 6])
    gen = TwTSequenceGenerator(CachedEnsemble([model]), task.target_dictionary, beam_size=2, max_len_a=0, max_len_b=8)
    gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": lengths}})
    assert sorted(calls) == ["k"] * 3 + ["v"] * 3  # one batch, three layers, whatever the steps


@pytest.mark.parametrize("generation", [False, True], ids=["validation", "generate"])
@pytest.mark.parametrize("arch", ["transformer_qknorm", "transformer_lpqknorm", "transformer_postnorm"])
@pytest.mark.parametrize("search", [TwTSequenceGenerator, GNMTSequenceGenerator], ids=["twt", "fairseq"])
@pytest.mark.parametrize("moved_only", [True, False], ids=["cpu-reorder", "gpu-reorder"])
def test_both_searches_make_the_same_hypotheses_with_either_step(tiny_data, arch, generation, search, moved_only,
                                                                 monkeypatch):
    monkeypatch.setattr(decoder_cache, "moved_rows_only", lambda device: moved_only)
    model, task = _model(tiny_data, arch, generation)
    src, lengths = _source(task, [3, 7, 5, 2, 6], seed=2)
    sample = {"net_input": {"src_tokens": src, "src_lengths": lengths}}
    out = [search(models, task.target_dictionary, beam_size=4, max_len_a=1, max_len_b=40).generate([model], sample)
           for models in ([model], CachedEnsemble([model]))]
    for old, new in zip(*out):
        assert [h["tokens"].tolist() for h in old] == [h["tokens"].tolist() for h in new]
        for a, b in zip(old, new):
            assert torch.equal(a["score"], b["score"]) and torch.equal(a["positional_scores"], b["positional_scores"])
    if search is TwTSequenceGenerator:  # its length limits are each sentence's: they leave the batch at different steps
        assert len({len(hypos[0]["tokens"]) for hypos in out[0]}) > 1


def test_task_picks_the_step_and_says_why_when_it_cannot_cache(tiny_data, caplog):
    model, task = _model(tiny_data, "transformer_qknorm", generation=False)
    stock, _ = build(tiny_data / "bin", "transformer")  # fairseq's own model
    d = task.target_dictionary

    def generator(step, models, **args):
        search = {} if args else {"beam_search": "twt", "length_norm": "gnmt"}
        cfg = TranslationQKConfig(decoder_step=step, **search)
        return TranslationQKTask(cfg, d, d).build_generator(models, argparse.Namespace(beam=4, **args))

    assert type(generator("cached", [model]).model) is CachedEnsemble
    assert type(generator("fairseq", [model]).model).__name__ == "EnsembleModel"
    with caplog.at_level(logging.INFO):
        assert type(generator("cached", [stock]).model).__name__ == "EnsembleModel"
        assert type(generator("cached", [model], print_alignment="hard").model).__name__ == "EnsembleModelWithAlignment"
    assert "decoder step: fairseq's (TransformerModel is not a qknorm_transformer model" in caplog.text
    assert "decoder step: fairseq's (--print-alignment reads fairseq's attention weights)" in caplog.text
    with pytest.raises(ValueError, match=r"--decoder-step cached: TransformerModel is not a qknorm_transformer "
                                         r"model \(its decoder layers are fairseq's own\); use --decoder-step fairseq"):
        CachedEnsemble([stock])
    assert unsupported(model) is None
    assert DECODER_STEPS == validation.DECODER_STEPS  # the benchmark's choices, declared without fairseq


def test_the_cache_refuses_what_it_cannot_decode(tiny_data):
    model, task = _model(tiny_data, "transformer_qknorm", generation=False)
    src, lengths = _source(task, [4])
    with torch.no_grad():
        enc = model.encoder(src, src_lengths=lengths)
        cache = DecoderCache(model, enc)
        eos = task.target_dictionary.eos()
        with pytest.raises(RuntimeError, match="holds 0 steps of 1 rows, not 1 of 1: a search reorders it"):
            cache.step(torch.full((1, 2), eos))
        model.train()
        with pytest.raises(RuntimeError, match="in evaluation mode: call model.eval"):
            DecoderCache(model, enc)
