"""`--beam-search twt` (qknorm_fairseq/twt_search.py): TwT's beam_decode, against a hand-computed
case and against per-sentence decoding of a real model."""
import argparse

import numpy as np
import pytest
import torch
from fairseq.data import Dictionary
from fairseq.models import FairseqEncoder, FairseqEncoderDecoderModel, FairseqIncrementalDecoder

from qknorm_fairseq.task import GNMTSequenceGenerator, TranslationQKConfig, TranslationQKTask
from qknorm_fairseq.twt_search import TwTSequenceGenerator

from helpers import build

D = Dictionary()
A, B, C, DD, E = (D.add_symbol(w) for w in "a b c d e".split())
EOS = D.eos()
LOW = -10.0  # every continuation the script does not name (EOS: 2 * LOW)

# Log-probabilities of the next token after each prefix (BOS excluded).
SCRIPT = {
    (): {A: -0.3, B: -0.32},
    (A,): {EOS: -0.4, C: -0.41},
    (B,): {DD: -0.4},
    (A, C): {E: -1.0, EOS: -2.0},
    (B, DD): {EOS: -0.01},
    (A, C, E): {EOS: -0.1},
}


class _Encoder(FairseqEncoder):
    def forward(self, src_tokens, src_lengths=None):
        return {"src": src_tokens}

    def reorder_encoder_out(self, encoder_out, new_order):
        return {"src": encoder_out["src"].index_select(0, new_order)}


class _ScriptedDecoder(FairseqIncrementalDecoder):
    """Returns SCRIPT's log-probabilities for the last position of each row's prefix."""

    def forward(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        out = torch.full((prev_output_tokens.size(0), 1, len(self.dictionary)), LOW)
        out[..., EOS] = 2 * LOW
        for row, prefix in enumerate(prev_output_tokens.tolist()):
            for tok, lp in SCRIPT.get(tuple(prefix[1:]), {}).items():
                out[row, 0, tok] = lp
        return out, {"attn": [None]}

    def reorder_incremental_state(self, incremental_state, new_order):
        pass


class _ScriptedModel(FairseqEncoderDecoderModel):
    def get_normalized_probs(self, net_output, log_probs, sample=None):
        return net_output[0]  # already log-probabilities (need not sum to 1 for the search)


def _decode(gen_cls, beam=2, alpha=1.0):
    model = _ScriptedModel(_Encoder(D), _ScriptedDecoder(D)).eval()
    gen = gen_cls([model], D, beam_size=beam, max_len_a=0, max_len_b=10, gnmt_alpha=alpha)
    src = torch.tensor([[A, EOS]])
    hypos = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([2])}})
    return hypos[0]


def test_hand_computed_case_where_twt_and_fairseq_differ():
    """Beam 2, alpha 1, so lp(n) = (5 + n) / 6 for n tokens (EOS included).

    Step 1: a -0.3, b -0.32 (EOS is forbidden at the first step).
    Step 2 (lp 7/6): 'a EOS' cum -0.70 -> score -0.6000; 'a c' -0.71 -> -0.6086; 'b d' -0.72 -> -0.6171.
      TwT keeps the top two scores: 'a EOS' (ended, frozen at -0.6) and 'a c'; 'b d' is pruned.
      fairseq takes the top 2x2 by cumulative log-prob (a EOS, a c, b d, ...), finalises 'a EOS'
      (it is among the top 2) and keeps two live hypotheses: 'a c' and 'b d'.
    Step 3 (lp 8/6): TwT: 'a EOS' offers only EOS at -0.6; 'a c e' -1.71 -> -1.2825; 'a c EOS' -2.71 ->
      -2.0325. Kept: 'a EOS', 'a c e'.
      fairseq: 'b d EOS' -0.73 is the best candidate: finalised. Two finished: fairseq stops and
      GNMT re-ranks them: 'b d' -0.73 / (8/6) = -0.5475 beats 'a' -0.70 / (7/6) = -0.6.
    Step 4 (lp 9/6): TwT: 'a c e EOS' -1.81 -> -1.2067; both slots have ended: TwT stops and outputs
      its best slot, 'a' at -0.6 ('b d', which would have won, left the beam at step 2).
    """
    twt = _decode(TwTSequenceGenerator)
    fs = _decode(GNMTSequenceGenerator)
    assert twt[0]["tokens"].tolist() == [A, EOS]
    assert float(twt[0]["score"]) == pytest.approx(-0.7 / (7 / 6))
    assert [h["tokens"].tolist() for h in twt] == [[A, EOS], [A, C, E, EOS]]
    assert float(twt[1]["score"]) == pytest.approx(-1.81 / (9 / 6))
    assert twt[1]["positional_scores"].tolist() == pytest.approx([-0.3, -0.41, -1.0, -0.1])
    assert fs[0]["tokens"].tolist() == [B, DD, EOS]
    assert float(fs[0]["score"]) == pytest.approx(-0.73 / (8 / 6))


def test_eos_forbidden_at_first_step_and_max_length():
    SCRIPT_EOS_FIRST = {(): {EOS: -0.01, A: -0.5}}
    saved = dict(SCRIPT)
    SCRIPT.clear()
    SCRIPT.update(SCRIPT_EOS_FIRST)
    try:
        model = _ScriptedModel(_Encoder(D), _ScriptedDecoder(D)).eval()
        gen = TwTSequenceGenerator([model], D, beam_size=2, max_len_a=1, max_len_b=2, gnmt_alpha=0.6)
        src = torch.tensor([[A, A, EOS]])  # source length 2 -> at most 2 + 2 tokens before EOS
        hypos = gen.generate([model], {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([3])}})[0]
    finally:
        SCRIPT.clear()
        SCRIPT.update(saved)
    best = hypos[0]["tokens"].tolist()
    assert best[0] == A  # not EOS, though EOS has the highest probability at step 1
    assert len(best) == 2 + 2 + 1 and EOS not in best  # cut at its own maximum length, no EOS


def test_an_exact_tie_goes_to_the_higher_slot_as_in_the_original():
    """The original's final pick is np.argsort(scores)[::-1]: of two equal scores, the later slot."""
    model = _ScriptedModel(_Encoder(D), _ScriptedDecoder(D)).eval()
    gen = TwTSequenceGenerator([model], D, beam_size=3, max_len_b=5, gnmt_alpha=0.6)
    slots = torch.tensor([[EOS, A, EOS], [EOS, B, EOS], [EOS, C, EOS]])
    scores = torch.tensor([-0.5, -0.4, -0.4])
    hypos = gen._hypotheses(slots.tolist(), np.zeros((3, 2), np.float32), scores.numpy())
    assert [h["tokens"].tolist() for h in hypos] == [[C, EOS], [B, EOS], [A, EOS]]
    assert [float(h["score"]) for h in hypos] == pytest.approx([-0.4, -0.4, -0.5])
    assert list(np.argsort(scores.numpy(), kind="stable")[::-1]) == [2, 1, 0]  # the original's order


def test_task_builds_the_twt_generator_and_refuses_fairseq_length_norm():
    args = argparse.Namespace(beam=4)
    with pytest.raises(ValueError, match="--beam-search twt ranks the beam by GNMT"):
        TranslationQKTask(TranslationQKConfig(beam_search="twt"), D, D).build_generator([], args)
    model = _ScriptedModel(_Encoder(D), _ScriptedDecoder(D)).eval()
    task = TranslationQKTask(TranslationQKConfig(beam_search="twt", length_norm="gnmt", gnmt_alpha=0.6), D, D)
    gen = task.build_generator([model], argparse.Namespace(beam=4))
    assert isinstance(gen, TwTSequenceGenerator) and gen.gnmt_alpha == 0.6


@pytest.mark.parametrize("arch", ["transformer_qknorm", "transformer_postnorm"])
def test_batched_decoding_equals_one_sentence_at_a_time(tiny_data, arch):
    """Incremental-state and encoder reordering, including sentences leaving the batch early."""
    model, task = build(tiny_data / "bin", arch)
    model.eval()
    d = task.source_dictionary
    g = torch.Generator().manual_seed(1)
    lengths = [3, 7, 5, 2, 6]
    sents = [torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])])
             for n in lengths]
    width = max(len(s) for s in sents)
    src = torch.full((len(sents), width), d.pad())
    for i, s in enumerate(sents):
        src[i, width - len(s):] = s  # fairseq pads sources on the left
    gen = TwTSequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_a=1, max_len_b=3)
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor([len(s) for s in sents])}}
    batched = gen.generate([model], sample)
    for i, s in enumerate(sents):
        alone = gen.generate([model], {"net_input": {"src_tokens": s[None], "src_lengths": torch.tensor([len(s)])}})
        assert [h["tokens"].tolist() for h in batched[i]] == [h["tokens"].tolist() for h in alone[0]]
        assert torch.allclose(torch.stack([h["score"] for h in batched[i]]),
                              torch.stack([h["score"] for h in alone[0]]), atol=1e-5)
    # different source lengths give different maximum lengths: sentences leave the batch at different steps
    assert len({max(len(h["tokens"]) for h in hyps) for hyps in batched}) > 1


def test_the_search_reads_the_device_once_a_step_and_once_when_sentences_finish(tiny_data):
    """Host-device syncs of the search's own code (reads of device values and data-dependent
    shapes, as step_profile counts them): one a step, which sentences are done, and one more on a
    step where some are, which are left; none per finished sentence or slot. Bulk copies to the
    host (.tolist(), .cpu()) are not dispatched ops on a CPU and go uncounted."""
    from qknorm_pipeline.benchmark.step_profile import OpCounter

    model, task = build(tiny_data / "bin", "transformer_qknorm")
    model.eval()
    d = task.source_dictionary
    g = torch.Generator().manual_seed(2)
    lengths = [2, 3, 4, 5, 6, 7, 8, 9]  # limits of n + 1 steps: sentences leave at different steps
    src = torch.full((len(lengths), max(lengths) + 1), d.pad())
    for i, n in enumerate(lengths):
        src[i, -n - 1:] = torch.cat([torch.randint(d.nspecial, len(d), (n,), generator=g), torch.tensor([d.eos()])])
    gen = TwTSequenceGenerator([model], task.target_dictionary, beam_size=4, max_len_a=1, max_len_b=0)
    calls = [0]
    forward = model.decoder.forward
    model.decoder.forward = lambda *a, **kw: (calls.__setitem__(0, calls[0] + 1), forward(*a, **kw))[1]
    sample = {"net_input": {"src_tokens": src, "src_lengths": torch.tensor(lengths) + 1}}
    counter = OpCounter()
    with counter:
        hypos = gen.generate([model], sample)
    ours = [s["where"] for s in counter.syncs if s["kind"] == "sync" and "twt_search.py" in s["where"]]
    steps = calls[0]
    finishing = len({max(len(h["tokens"]) for h in hyps) for hyps in hypos} - {steps})  # steps some leave at
    assert len(hypos) == 8 and steps <= 10 and finishing >= 1
    # the length limit once, one a step, one more on each step that some sentences leave (not the last)
    assert len(ours) <= 1 + steps + finishing and len(ours) < 4 * len(hypos), ours
