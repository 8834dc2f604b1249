"""Beam search's decoder step with a preallocated key/value cache (the task's `--decoder-step cached`).

fairseq's incremental decoding (`--decoder-step fairseq`) keeps every attention's keys and values in
the search's incremental_state: each step concatenates the new key and value to them (a copy of the
whole cache), and each reordering of the beam copies every layer's keys and values again, tensor by
tensor. Here, for a qknorm_transformer model in evaluation mode:
- one buffer holds every layer's self-attention keys and values, (row, layer, key|value, head,
  position, head_dim): a step writes each layer's new keys and values in place, with one copy; a
  reordering copies, over the positions so far, on a CPU only the rows whose parent is another row, on
  a GPU every row (without reading the device: `moved_rows_only`);
- the source side's keys and values (QKNorm: normalised) are computed once per batch, one copy per
  sentence, its padding mask once; they are reordered only when sentences leave the batch;
- the target embeddings (scaled, FixNorm-normalised), the positions, the projections' weights (the
  self-attention's three as one matrix) and the output bias are prepared once per batch.
The arithmetic is the model's own, on the same values and through the same kernels (a matrix
product computes every row alike whatever the rows beside it, and the query, key and value
projections as one product compute the same numbers as three): its norms, NormAttention's
normalisation and its fused or explicit attention (the explicit weights where fairseq's decoder asks
for them), so the log-probabilities equal fairseq's incremental path's bit for bit
(tests/unit/test_decoder_cache.py). fairseq's search and TwT's both drive it unchanged through
CachedEnsemble, fairseq's EnsembleModel with this step. The decoder's attention weights are not
returned (fairseq-generate's --print-alignment keeps fairseq's step).
"""
import math

import torch
from fairseq.sequence_generator import EnsembleModel

from .attention import lp_normalize
from .decoder_rows import layer_rows
from .model import QKDecoder, rows_problem

KEY = "qknorm_decoder_cache"  # the cache's entry in the search's incremental state and encoder output
FIRST_POSITIONS = 32  # the buffer's first length; it doubles when a hypothesis outgrows it


def moved_rows_only(device):
    """Whether a reordering copies only the rows whose parent is another row: on a CPU, where the copy
    is the cost. Finding them (nonzero) makes the host wait for the device, so a GPU copies every row,
    a few queued kernels and no host-device sync per beam step."""
    return device.type == "cpu"


def unsupported(model):
    """Why DecoderCache cannot run MODEL's decoder (None if it can)."""
    decoder = getattr(model, "decoder", None)
    if not isinstance(decoder, QKDecoder):
        return f"{type(model).__name__} is not a qknorm_transformer model (its decoder layers are fairseq's own)"
    return rows_problem(decoder)


def _transposed(*linears):
    """(weight^T, bias) of nn.Linear layers' outputs side by side, as F.linear multiplies them."""
    weight = torch.cat([m.weight for m in linears]) if len(linears) > 1 else linears[0].weight
    biases = [m.bias for m in linears]
    bias = None if biases[0] is None else torch.cat(biases) if len(biases) > 1 else biases[0]
    return weight.t(), bias


def _linear(x, weight_t, bias):
    # F.linear's own call for a 2-D input, its weight transposed once per batch
    return torch.mm(x, weight_t) if bias is None else torch.addmm(bias, x, weight_t)


class _Layer:
    """One decoder layer's modules and prepared weights; the source's keys and values."""

    def __init__(self, layer, source, explicit):
        self.layer, self.attn, self.cross = layer, layer.self_attn, layer.encoder_attn
        self.qkv = _transposed(self.attn.q_proj, self.attn.k_proj, self.attn.v_proj)
        self.out = _transposed(self.attn.out_proj)
        self.ffn = _transposed(layer.fc1), _transposed(layer.fc2)
        self.explicit = explicit
        if self.cross is not None:
            self.cross_q, self.cross_out = _transposed(self.cross.q_proj), _transposed(self.cross.out_proj)
            self.set_source(*source)

    def set_source(self, k, v, pad):
        """The source's keys and values (sentences, heads, src_len, head_dim), each head's in one block
        (the kernels compute the same numbers from any layout, faster from this one), and its padding mask."""
        k, v = k.contiguous(), v.contiguous()
        self.source = k, v, pad
        self.bmm_source = None

    def explicit_source(self):
        """The source for explicit weights, as the 3-D operands torch.matmul hands bmm in NormAttention._explicit:
        keys (fp32, transposed), values and padding; prepared when first asked (the step loop needs none)."""
        if self.bmm_source is None:
            k, v, pad = self.source
            heads, length = k.size(1), k.size(2)
            self.bmm_source = (k.float().view(-1, length, k.size(3)).transpose(1, 2), v.view(-1, length, v.size(3)),
                               None if pad is None else pad[:, None, None, :].expand(-1, heads, 1, -1).reshape(-1, 1, length))
        return self.bmm_source


class DecoderCache:
    """One batch's decoder state for beam search over MODEL (a qknorm_transformer, in evaluation mode),
    built from its encoder output with each sentence repeated for every beam, as fairseq's searches
    hold it."""

    def __init__(self, model, encoder_out):
        self.model, d = model, model.decoder
        if d.training:
            raise RuntimeError("the decoder cache decodes a model in evaluation mode: call model.eval() first")
        source = encoder_out["encoder_out"][0]  # (src_len, rows, embed)
        pad = encoder_out["encoder_padding_mask"]
        self.rows = source.size(1)
        layers = list(d.layers)
        attn = layers[0].self_attn
        self.heads, self.head_dim, self.beam = attn.num_heads, attn.head_dim, attn.beam_size
        # fairseq's decoder asks a layer's cross-attention for its weights (computed explicitly, another
        # rounding than the fused kernel's) when the layer's need_attn is set, and always the last layer's
        self.layers = [_Layer(layer, None if layer.encoder_attn is None else layer.encoder_attn.source_keys(
            source, source, pad[0] if pad else None, self.rows), i == len(layers) - 1 or layer.need_attn)
            for i, layer in enumerate(layers)]
        self._share_mask()
        types = torch.arange(d.embed_tokens.num_embeddings, device=source.device)
        self.embeddings = d.embed_scale * d.embed_tokens(types)  # the rows of fairseq's scaled lookup
        out = d.output_projection
        self.output = (out.embedding[0].normalized_weight() if hasattr(out, "embedding") else out.weight).t()
        self.logit_terms = d.logit_terms()
        self.steps, self.kv = 0, None
        self.row_numbers = torch.arange(self.rows, device=source.device)
        self._allocate(FIRST_POSITIONS, source)

    def _share_mask(self):
        # one padding mask object for every layer: NormAttention builds its additive mask once for it
        masks = [c.source[2] for c in self.layers if c.cross is not None]
        for c in self.layers:
            if c.cross is not None:
                c.set_source(*c.source[:2], masks[0])

    def _allocate(self, positions, like):
        """A buffer for POSITIONS steps (the steps so far copied into it), and the positions' embeddings."""
        old = None if self.kv is None else self.view()[..., :self.steps, :]
        self.shape = (len(self.layers), 2, self.heads, positions, self.head_dim)
        self.row_size = math.prod(self.shape)
        self.kv = like.new_empty(self.rows * self.row_size)
        if old is not None:
            self.view()[..., :self.steps, :] = old
        self._layer_views()
        d = self.model.decoder
        self.positions = None
        if d.embed_positions is not None:
            # fairseq's positions of a whole prefix: row n is what its incremental lookup gives step n
            numbered = torch.full((1, min(positions, d.max_positions())), d.padding_idx + 1, dtype=torch.long,
                                  device=like.device)
            self.positions = d.embed_positions(numbered)[0]

    def view(self):
        """The buffer as (row, layer, key|value, head, position, head_dim) for the current rows: each head's
        keys (and values) one block, as the attention kernel reads them."""
        return self.kv[:self.rows * self.row_size].view(self.rows, *self.shape)

    def _layer_views(self):
        self.rows_view = kv = self.view()
        for i, layer in enumerate(self.layers):
            layer.kv = kv[:, i]  # (row, key|value, head, position, head_dim)
            layer.keys, layer.values = layer.kv[:, 0], layer.kv[:, 1]

    def step(self, tokens, temperature=1.0):
        """Log-probabilities (rows, vocab) of the token after TOKENS (rows, t + 1), whose first t tokens
        went through this cache in earlier steps."""
        t = tokens.size(1) - 1
        if t != self.steps or tokens.size(0) != self.rows:
            raise RuntimeError(f"the decoder cache holds {self.steps} steps of {self.rows} rows, not {t} of "
                               f"{tokens.size(0)}: a search reorders it (reorder_incremental_state) whenever its "
                               "rows change")
        if t == self.shape[3]:
            self._allocate(2 * t, self.kv)
        d = self.model.decoder
        # fairseq's extract_features_scriptable, one step, as (rows, embed)
        x = self.embeddings.index_select(0, tokens[:, t])
        if self.positions is not None:
            x += self.positions[t]  # in place, as fairseq adds them: x keeps its dtype
        if d.layernorm_embedding is not None:
            x = d.layernorm_embedding(x)
        x = d.dropout_module(x)
        for layer in self.layers:
            x = self._layer(layer, x, t)
        if d.layer_norm is not None:
            x = d.layer_norm(x)
        logits = d.finish_logits(torch.mm(x, self.output), *self.logit_terms)
        if temperature != 1:
            logits = logits.div_(temperature)
        self.steps += 1
        return self.model.get_normalized_probs((logits, None), log_probs=True, sample=None)

    def _layer(self, c, x, t):
        # fairseq's TransformerDecoderLayerBase.forward for one step
        layer, ffn = c.layer, c.ffn
        return layer_rows(layer, x, lambda h: self._self(c, h, t), None if c.cross is None else lambda h: self._cross(c, h),
                          lambda h: _linear(layer.activation_dropout_module(layer.activation_fn(_linear(h, *ffn[0]))),
                                            *ffn[1]))

    def _self(self, c, x, t):
        """Self-attention of one step through out_proj, the new keys and values written to the cache."""
        attn, rows = c.attn, self.rows
        qkv = _linear(x, *c.qkv).view(rows, 3, self.heads, self.head_dim)
        if attn.scores == "qknorm":  # q and k normalised in place (NormAttention caches normalised keys)
            # pow's vector lanes follow a tensor's shape, so for p != 2 q and k apart, as NormAttention does
            for qk in [qkv.narrow(1, 0, 2)] if attn.p == 2 else [qkv.select(1, 0), qkv.select(1, 1)]:
                lp_normalize(qk, attn.p, out=qk)
        c.kv.select(3, t).copy_(qkv.narrow(1, 1, 2))
        x = attn._fused(qkv.select(1, 0).unsqueeze(2), c.keys.narrow(2, 0, t + 1), c.values.narrow(2, 0, t + 1),
                        None, None, step=True)
        return _linear(x.view(rows, -1), *c.out)

    def _cross(self, c, x):
        """Encoder-decoder attention of one step through out_proj, the beams of a sentence folded into
        its queries as NormAttention.attend folds them; through the step loop where it takes them (its
        output is the same with or without the weights fairseq's step asks of the last layer), else
        explicit weights as NormAttention._explicit computes them (softmax over the keys), its matmuls as
        the bmm calls they make."""
        attn, (k, v, pad) = c.cross, c.source
        q = _linear(x, *c.cross_q).view(self.rows, self.heads, self.head_dim)
        if attn.scores == "qknorm":
            q = lp_normalize(q, attn.p)
        sentences = k.size(0)
        q = q.view(sentences, -1, self.heads, self.head_dim).transpose(1, 2).contiguous()
        looped = attn._step_loop(q, k, v, pad, None)
        if looped is not None:
            out = looped[0].transpose(1, 2)
        elif not c.explicit:  # the loop refused them: the attention kernel's own path
            out = attn._fused(q, k, v, pad, None).transpose(1, 2)
        else:
            keys_t, values, source_pad = c.explicit_source()
            q = q.float().view(-1, q.size(2), self.head_dim)
            scores = attn.qk_scale * torch.bmm(q, keys_t) if attn.scores == "qknorm" else torch.bmm(q * attn.scaling, keys_t)
            if source_pad is not None:
                scores = scores.masked_fill(source_pad, float("-inf"))
            probs = attn.dropout_module(torch.softmax(scores, dim=-1)).to(v.dtype)
            out = torch.bmm(probs, values).view(sentences, self.heads, -1, self.head_dim).transpose(1, 2)
        return _linear(out.reshape(self.rows, -1), *c.cross_out)

    def reorder(self, order):
        """Row i continues row order[i] (the beam's parents; finished sentences' rows left out)."""
        rows = order.numel()
        k = next((c.source[0] for c in self.layers if c.cross is not None), None)
        if k is not None and k.size(0) * self.beam != rows:
            # sentences left the batch (fairseq's MultiheadAttention.reorder_incremental_state): their
            # rows are consecutive, the source kept once per sentence when beam > 1
            keep = order.reshape(-1, self.beam)[:, 0] // self.beam if self.beam > 1 else order
            for c in self.layers:
                if c.cross is not None:
                    c.source = tuple(None if s is None else s.index_select(0, keep) for s in c.source)
            self._share_mask()
        # row i of the buffer is at the same place whatever the number of rows: rows move in place
        kv = self.rows_view.narrow(4, 0, self.steps)
        if moved_rows_only(kv.device):
            moved = order.ne(self.row_numbers[:rows]).nonzero().view(-1)
            if moved.numel():
                kv.index_copy_(0, moved, kv.index_select(0, order[moved]))
        else:
            kv.narrow(0, 0, rows).copy_(kv.index_select(0, order))
        if rows != self.rows:
            self.rows = rows
            self._layer_views()


class CachedEnsemble(EnsembleModel):
    """fairseq's EnsembleModel whose models (qknorm_transformer, see `unsupported`) decode through a
    DecoderCache each, kept in the search's incremental states."""

    def __init__(self, models):
        problems = [p for p in map(unsupported, models) if p]
        if problems:
            raise ValueError(f"--decoder-step cached: {problems[0]}; use --decoder-step fairseq")
        super().__init__(models)

    def forward_decoder(self, tokens, encoder_outs, incremental_states, temperature: float = 1.0):
        log_probs = []
        for model, encoder_out, state in zip(self.models, encoder_outs, incremental_states):
            cache = state.get(KEY)
            if cache is None:
                cache = state[KEY] = DecoderCache(model, encoder_out)
                encoder_out[KEY] = []  # read: the cache holds all the decoder needs of it
            log_probs.append(cache.step(tokens, temperature))
        if self.models_size == 1:
            return log_probs[0], None
        return torch.logsumexp(torch.stack(log_probs, dim=0), dim=0) - math.log(self.models_size), None

    def reorder_incremental_state(self, incremental_states, new_order):
        for state in incremental_states:
            if KEY in state:
                state[KEY].reorder(new_order)

    def reorder_encoder_out(self, encoder_outs, new_order):
        if encoder_outs and KEY in encoder_outs[0]:
            return encoder_outs  # its keys and values live in the caches, reordered with them
        return super().reorder_encoder_out(encoder_outs, new_order)
