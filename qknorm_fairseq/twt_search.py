"""TwT's beam search (`--beam-search twt`): the procedure of the original code's `beam_decode`.

It differs from fairseq's search (sequence_generator.py) in what the beam holds:
- every live extension at step t is ranked by its GNMT-normalised score
  cum_logprob / ((5 + t) / 6) ** alpha, t counting the tokens so far (EOS included), inside the
  beam at every step, not only when sorting finished hypotheses;
- a hypothesis that emits EOS keeps its frozen score and its beam slot (it can only "extend" by
  EOS at no cost), so the top `beam` at each step are chosen among live extensions and finished
  hypotheses together; fairseq moves finished ones out and keeps `beam` live ones;
- EOS is forbidden at the first step;
- a sentence ends when every slot has ended with EOS, or after max_len_a * n + max_len_b + 1
  steps, n its source tokens without EOS: with the recipe's 1 and 50 a hypothesis cut there has
  n + 51 tokens and no EOS. The original's limit is the same number, (n + 1) + 50, but its loop's
  `time_step == maximum_length` test lets every sentence except the longest in its batch emit one
  more symbol (n + 52): an artefact of batching, not reproduced;
- the best slot is the output (all slots are returned, best first); on an exact tie the original's
  `np.argsort(scores)[::-1]` takes the higher slot, and so does this search.
The hypotheses come back on the host (fairseq's search leaves them on the model's device, and its
callers copy them to the host one by one).
"""
import numpy as np
import torch
from fairseq.sequence_generator import SequenceGenerator

NO_ALIGNMENT = torch.empty(0)  # every hypothesis's "alignment" (fairseq's format: empty without alignment)


def gnmt_penalty(length, alpha):
    """GNMT's length penalty lp(y) = ((5 + |y|) / 6) ** alpha (Wu et al. 2016)."""
    return ((5.0 + length) / 6.0) ** alpha


class TwTSequenceGenerator(SequenceGenerator):
    def __init__(self, *args, gnmt_alpha=0.6, **kwargs):
        super().__init__(*args, **kwargs)
        self.gnmt_alpha = gnmt_alpha

    @torch.no_grad()
    def _generate(self, sample, prefix_tokens=None, constraints=None, bos_token=None):
        if prefix_tokens is not None or constraints is not None:
            raise NotImplementedError("--beam-search twt supports neither --prefix-size nor constraints")
        src = sample["net_input"]["src_tokens"]
        bsz, k, device = src.size(0), self.beam_size, src.device
        src_lengths = (src.ne(self.eos) & src.ne(self.pad)).long().sum(1)
        limit = (self.max_len_a * src_lengths + self.max_len_b).long().clamp(max=self.max_len - 1) + 1

        incremental_states = [{} for _ in range(self.model.models_size)]
        rows = torch.arange(bsz, device=device).repeat_interleave(k)
        encoder_outs = self.model.reorder_encoder_out(self.model.forward_encoder(sample["net_input"]), rows)
        tokens = torch.full((bsz * k, 1), self.eos if bos_token is None else bos_token, dtype=torch.long,
                            device=device)
        cum = torch.zeros(bsz, k, device=device)             # cumulative log-probabilities
        score = torch.zeros(bsz, k, device=device)           # their normalised scores
        pos_scores = torch.zeros(bsz * k, 0, device=device)  # per-token log-probabilities
        ended = torch.zeros(bsz, k, dtype=torch.bool, device=device)
        sent = list(range(bsz))                              # original index of each active sentence
        first_slot = torch.arange(bsz, device=device).unsqueeze(1) * k  # row of each sentence's slot 0
        eos_only = torch.full((self.vocab_size,), float("-inf"), device=device)  # an ended slot's only
        eos_only[self.eos] = 0                                                    # candidate: EOS, no cost
        finalized = [None] * bsz

        # The host reads the device once a step (which sentences are done) and once more, in bulk, on
        # a step where some are: a GPU waits at every read.
        limits = limit.tolist()
        shortest = min(limits)
        for t in range(int(max(limits))):
            n = len(sent)
            lprobs, _ = self.model.forward_decoder(tokens, encoder_outs, incremental_states, self.temperature)
            lprobs = lprobs.view(n, k, -1)
            lprobs.select(2, self.pad).fill_(float("-inf"))
            if t == 0:
                lprobs[:, :, self.eos] = float("-inf")
                lprobs[:, 1:] = float("-inf")  # all slots hold the same prefix: expand the first only
            vocab = lprobs.size(-1)
            keep = ended.unsqueeze(-1)
            lprobs = torch.where(keep, eos_only, lprobs)
            cand_cum = cum.unsqueeze(-1) + lprobs
            cand_score = torch.where(keep, score.unsqueeze(-1) + eos_only, cand_cum / gnmt_penalty(t + 1, self.gnmt_alpha))

            score, idx = cand_score.view(n, -1).topk(k, dim=1)
            cum = cand_cum.view(n, -1).gather(1, idx)
            tok_lprob = lprobs.view(n, -1).gather(1, idx)
            parent = (idx // vocab + first_slot[:n]).view(-1)
            symbol = idx % vocab
            ended = symbol.eq(self.eos)
            tokens = torch.cat([tokens[parent], symbol.view(-1, 1)], 1)
            pos_scores = torch.cat([pos_scores[parent], tok_lprob.view(-1, 1)], 1)

            done = ended.all(1)
            if t + 1 >= shortest:  # some sentence reaches its length limit (read on the host once)
                done = done | limit.le(t + 1)
            done_rows = done.nonzero().view(-1)
            finished = done_rows.tolist()
            if finished:
                slots = tokens.view(n, k, -1)[done_rows].tolist()
                positional = pos_scores.view(n, k, -1)[done_rows].cpu().numpy()
                scores = score[done_rows].cpu().numpy()
                for j, i in enumerate(finished):
                    finalized[sent[i]] = self._hypotheses(slots[j], positional[j], scores[j])
                if len(finished) == n:
                    break
                gone = set(finished)
                sent = [s for i, s in enumerate(sent) if i not in gone]
                alive = (~done).nonzero().view(-1)
                alive_rows = (alive.unsqueeze(1) * k + torch.arange(k, device=device)).view(-1)
                encoder_outs = self.model.reorder_encoder_out(encoder_outs, alive_rows)
                parent = parent.view(n, k)[alive].view(-1)
                tokens, pos_scores = tokens[alive_rows], pos_scores[alive_rows]
                cum, score, ended, limit = cum[alive], score[alive], ended[alive], limit[alive]
                limits = [lim for i, lim in enumerate(limits) if i not in gone]
                shortest = min(limits)
            self.model.reorder_incremental_state(incremental_states, parent)
        return finalized

    def _hypotheses(self, slots, pos_scores, scores):
        """One sentence's slots (token lists, BOS first; their per-token and normalised scores, numpy
        arrays on the host) as fairseq hypotheses (tokens end at the first EOS), best first; on a tie the
        higher slot first, as the original's argsort(scores)[::-1]. The tensors wrap those arrays
        (torch.from_numpy: one operation each, no copy or slice)."""
        hypos = []
        for slot, (toks, pos, s) in enumerate(zip(slots, pos_scores, scores)):
            toks = toks[1:]  # without BOS
            end = toks.index(self.eos) + 1 if self.eos in toks else len(toks)
            hypos.append((float(s), slot, {"tokens": torch.from_numpy(np.array(toks[:end], dtype=np.int64)),
                                           "score": torch.from_numpy(np.array(s)), "attention": None,
                                           "alignment": NO_ALIGNMENT, "positional_scores": torch.from_numpy(pos[:end])}))
        return [h for _, _, h in sorted(hypos, key=lambda h: h[:2], reverse=True)]
