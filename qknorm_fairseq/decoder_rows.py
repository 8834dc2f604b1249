"""The decoder on rows of tokens, (N, C) hidden states: `--packed-decoder` in training, and the
shape of a decoder layer that beam search's cached step (decoder_cache.py) shares.

fairseq pads every batch's targets to its longest one, and its batches are sorted by source length,
so on TED gl->en 38.7% of an epoch's target positions are pads; the decoder's position-wise work
(embeddings, norms, the attention projections, the feed-forward layers, the output layer and the loss
over the vocabulary) is most of an update. With --packed-decoder the decoder keeps one row per
target token; only the attention cores see a (sentences, length) grid, the rows scattered into
zeros there and gathered back: one grid per group of sentences of similar length (at most
--packed-groups N of 1 to 3 a batch), each trimmed to its longest sentence, so that the
self-attention's scores (sentences x length^2) are not those of the batch's longest target for every
sentence (docs/performance.md). The model returns the logits of those rows, (N, V), and get_targets the
targets of the same rows, so every criterion that flattens logits and targets (fairseq's too)
computes the same loss up to rounding: a token's output depends on no pad (pads are masked keys and
come after a sentence's end). Dropout draws masks of another shape, so a run is not the bit-for-bit
twin of one without the flag. On a CPU in bf16 (or fp16) the rows go on past the tokens to one of a few counts
(padded_size: at most 16 an octave, at most 1/16 more), copies of the last token that the attention cores never
read and whose logits are cut before the loss: oneDNN compiles a kernel for each such matrix-product
shape, and a batch's token count is new at most batches of epoch 1. fp32's products compile nothing per
shape, so in fp32 the rows stop at the tokens (pads_rows). They change no loss or gradient
but for rounding (the weight gradients' sums run over more rows, of zeros). On a CPU a group's grid is
written from the rows, and read back, by csrc/grids.c in one pass each, in the layout the attention's
products read (torch's ops: zeros, index_copy and a transposing copy; the same bits); under
--fused-kernels QKNorm's queries and keys are normalised straight into their grids instead
(fused_kernels.l2_grids).

With the target vocabulary mask (--target-vocab-mask) and this plugin's criterion the output layer
computes the logits of the types the decoder may generate only, (N, V'), and get_targets maps the
targets to their columns (a criterion of fairseq's would read column padding_idx as padding):
the other logits are -inf, which add nothing to the softmax, the loss or its gradient (on TED gl->en
at the study's 3,000 BPE merges 826 of 3,176 types: 26% of the output layer and of the loss's passes
over tokens x types). The training targets are allowed types by construction (the mask is made from
them); a mask loaded from a checkpoint trained on other data is checked against them at the first
forward, on every rank alike. Under autocast the learned bias is added in the products' precision
(the padded decoder adds it in fp32): rounding only. On a GPU reading the target lengths costs one
host-device sync per forward (the groups are chosen on the host, their indices copied back). The
decoder returns no attention weights (extra["attn"] is [None]): fairseq's decoder computes its last
layer's cross-attention weights in training too, which no criterion of this plugin reads.
"""
import ctypes

import numpy as np
import torch
import torch.nn.functional as F

from . import native
from .sublayers import feed_forward, residual_sublayers

# fairseq decoder features that the row forward does not implement
LAYER_EXTRAS = ("c_attn", "attn_ln", "ffn_layernorm", "w_resid")
DECODER_EXTRAS = ("adaptive_softmax", "quant_noise", "project_in_dim", "project_out_dim")


def fairseq_extras(decoder):
    """Why DECODER's layers cannot run on rows (None if they can); its layers are qknorm's."""
    for layer in decoder.layers:
        extras = [name for name in LAYER_EXTRAS if getattr(layer, name, None) is not None]
        if extras or layer.cross_self_attention:
            return f"its decoder layers use fairseq's {', '.join(extras) or 'cross_self_attention'}"
    for name in DECODER_EXTRAS:
        if getattr(decoder, name, None) is not None:
            return f"its decoder has fairseq's {name}"
    return None


# another length group only where it cuts the attention's (sentences x length^2) area by this much:
# each group costs every attention core's per-op overhead again
MIN_GAIN = 0.15


def group_sizes(lengths, max_groups, min_gain=MIN_GAIN):
    """The sizes of the groups (at most MAX_GROUPS, 1 to 3) that LENGTHS (sorted longest first) are
    cut into: contiguous groups, each padded to its first (longest) length, with the least sum of
    size x length^2; one more group only where it cuts that sum by MIN_GAIN."""
    lengths = np.asarray(lengths, dtype=np.float64)
    n = len(lengths)
    area = lengths ** 2
    # a cut is best where a new length starts (a cut inside a run of equal lengths pads more)
    cuts = np.flatnonzero(np.diff(lengths)) + 1
    sizes, cost = [n], n * area[0]
    if max_groups >= 2 and len(cuts):
        costs = cuts * area[0] + (n - cuts) * area[cuts]
        k = int(costs.argmin())
        if costs[k] <= (1 - min_gain) * cost:
            sizes, cost = [int(cuts[k]), n - int(cuts[k])], costs[k]
            if max_groups >= 3 and len(cuts) >= 2:
                i, j = (cuts[c] for c in np.triu_indices(len(cuts), k=1))
                costs = i * area[0] + (j - i) * area[i] + (n - j) * area[j]
                k = int(costs.argmin())
                if costs[k] <= (1 - min_gain) * cost:
                    sizes = [int(i[k]), int(j[k] - i[k]), n - int(j[k])]
    return sizes


def pads_rows(module):
    """Whether MODULE's (the decoder's or the encoder's) rows go on to padded_size: on a CPU where its products
    run in bf16 or fp16, for which oneDNN builds a kernel per shape; fp32's products build none, so there
    the rows would cost without paying."""
    weight = next(module.parameters())
    return weight.device.type == "cpu" and (weight.dtype != torch.float32 or torch.is_autocast_enabled("cpu"))


def padded_size(n):
    """N rounded up to a multiple of 2^(bits(N) - 5): at most 16 sizes an octave, at most N/16 more.
    oneDNN compiles a kernel for each matrix-product shape it meets (milliseconds each,
    docs/performance.md); a batch's token count is new at most batches of epoch 1, a padded one met again."""
    step = 1 << max(0, n.bit_length() - 5)
    return -(-n // step) * step


_GRID_COPY = ([ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p] + [ctypes.c_int64] * 4 + [ctypes.c_void_p, ctypes.c_int], None)


def _grids_library():
    """csrc/grids.c: the groups' grids gathered and scattered in one pass each (None: torch's ops)."""
    return native.kernels("grids", {"qk_rows_to_grid": _GRID_COPY, "qk_grid_to_rows": _GRID_COPY},
                          "--packed-decoder/--packed-encoder", "the grids are gathered and scattered by torch's ops")


def _native(x):
    """Whether the C copies take X: on a CPU, fp32 or bf16, and no autograd graph to record (the Rows
    functions' own forwards and backwards)."""
    return (x.device.type == "cpu" and x.dtype in native.DTYPES and not (torch.is_grad_enabled() and x.requires_grad)
            and native.is_enabled() and _grids_library() is not None)


class Group:
    """Sentences of a batch whose attention cores share one (sentences, length) grid: COUNT sentences
    (SENTENCES their places in the batch; None: the whole batch in its order), rows START..END of the
    packed rows, sentence by sentence, LENGTHS theirs, LOCAL their positions in the group's flat grid,
    KEY_PAD its pads (None: none)."""

    def __init__(self, sentences, count, length, start, end, lengths, local, key_pad):
        self.sentences, self.count, self.length, self.start, self.end = sentences, count, length, start, end
        self.lengths, self.local, self.key_pad = lengths, local, key_pad

    def grid(self, x):
        """the group's rows of X (N, heads, head_dim) -> (count, heads, length, head_dim), zeros at the pads"""
        rows = x[self.start:self.end]
        if _native(rows):  # one pass, into the layout the attention's products read
            rows = rows.contiguous()
            _, h, d = rows.shape
            out = rows.new_empty(self.count, h, self.length, d)
            _grids_library().qk_rows_to_grid(rows.element_size(), rows.data_ptr(), self.lengths.ctypes.data, self.count,
                                             h, d, self.length, out.data_ptr(), native.threads(out.numel()))
            return out
        full = rows.new_zeros(self.count * self.length, *rows.shape[1:]).index_copy(0, self.local, rows)
        return full.view(self.count, self.length, *rows.shape[1:]).transpose(1, 2)

    def take(self, x, out):
        """(count, heads, length, head_dim) -> the group's rows into OUT, (N_g, heads * head_dim) or (N_g, heads,
        head_dim)"""
        b, h, t, d = x.shape
        if _native(x) and out.is_contiguous():
            x = x.contiguous()
            _grids_library().qk_grid_to_rows(x.element_size(), x.data_ptr(), self.lengths.ctypes.data, b, h, d, t,
                                             out.data_ptr(), native.threads(out.numel()))
            return out
        return torch.index_select(x.transpose(1, 2).reshape(b * t, *out.shape[1:]), 0, self.local, out=out)


class Rows:
    """The non-pad positions of a (batch, length) grid of tokens, one row each, sentence by sentence.
    For the attention cores the sentences fall into length groups (group_sizes), each on a grid
    trimmed to its longest sentence: on TED gl->en a batch's target lengths vary widely (its
    sentences are sorted by source length), so one grid per batch pads 38.7% of its positions, three
    groups 11.4% (docs/performance.md). With more than one group the rows go group by group, longest
    sentences first. With PADDED (pads_rows) rows past the tokens follow (padded_size). One host read
    of the lengths (a sync on a GPU)."""

    def __init__(self, tokens, pad, max_groups, padded=False):
        self.bsz, self.length = tokens.shape
        real = tokens.ne(pad)
        # a sentence's first token: targets may be left- or right-padded
        lengths, starts = torch.stack([real.sum(1), real.to(torch.uint8).argmax(1)]).tolist()
        sizes = group_sizes(sorted(lengths, reverse=True), max_groups)
        # one group keeps the batch's order; more take the longest sentences first
        order = np.arange(self.bsz) if len(sizes) == 1 else np.argsort(-np.asarray(lengths), kind="stable")
        lengths, starts = np.asarray(lengths)[order], np.asarray(starts)[order]
        first_row = np.cumsum(lengths) - lengths  # each sentence's first row
        sentence = np.repeat(np.arange(self.bsz), lengths)  # each row's sentence, its place in ORDER
        position = np.arange(len(sentence)) - first_row[sentence]  # its position in that sentence
        device = tokens.device
        self.index = torch.from_numpy(order[sentence] * self.length + starts[sentence] + position).to(device)
        # with PADDED, rows past the tokens, copies of the last one (padded_size): each layer's products see one
        # of a few row counts; the attention cores never read them, and the logits are cut to the tokens' rows
        self.pad_rows = padded_size(len(sentence)) - len(sentence) if padded else 0
        self._taken = torch.cat([self.index, self.index[-1:].expand(self.pad_rows)]) if self.pad_rows else self.index
        self.groups = []
        first = 0
        for size in sizes:
            last = first + size
            length = int(lengths[first:last].max())  # the first but with one group (the batch in its order)
            start, end = int(first_row[first]), int(first_row[last - 1] + lengths[last - 1])
            local = (sentence[start:end] - first) * length + position[start:end]
            pads = np.arange(length)[None, :] >= lengths[first:last, None]
            sentences = None if len(sizes) == 1 else torch.from_numpy(order[first:last]).to(device)
            key_pad = torch.from_numpy(pads).to(device) if pads.any() else None
            self.groups.append(Group(sentences, size, length, start, end, lengths[first:last].astype(np.int64),
                                     torch.from_numpy(local).to(device), key_pad))
            first = last

    def take(self, x):
        """(batch, length, ...) -> (N + pad_rows, ...): the tokens' rows, then the padding rows"""
        return x.reshape(self.bsz * self.length, *x.shape[2:]).index_select(0, self._taken)

    def split(self, x):
        """X (batch, ...) -> each group's sentences of it (X itself with one group)"""
        if len(self.groups) == 1:
            return [x]
        if torch.is_grad_enabled() and x.requires_grad:
            return list(_Split.apply(x, self))
        return [x.index_select(0, group.sentences) for group in self.groups]

    def grids(self, x):
        """X (N + pad_rows, heads, head_dim) -> each group's grid of it (Group.grid)"""
        if torch.is_grad_enabled() and x.requires_grad:
            return list(_Grids.apply(x, self))
        return [group.grid(x) for group in self.groups]

    def from_grids(self, outs):
        """each group's grid OUTS[i] (count, heads, length, head_dim) -> their rows (N + pad_rows, heads *
        head_dim), zeros in the padding rows"""
        if torch.is_grad_enabled() and any(out.requires_grad for out in outs):
            return _FromGrids.apply(self, *outs)
        return _from_grids(self, outs)


# One autograd function each for the groups together: the gradient of X is written once, group by group
# into its rows (the groups' rows and sentences are disjoint), where autograd, through a slice or
# index_select per group, allocates a zero tensor of X's size for each group and then adds them up.

class _Split(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows):
        ctx.rows = rows
        return tuple(x.index_select(0, group.sentences) for group in rows.groups)

    @staticmethod
    def backward(ctx, *grads):
        dx = grads[0].new_empty(ctx.rows.bsz, *grads[0].shape[1:])  # the groups' sentences are all of them
        for group, grad in zip(ctx.rows.groups, grads):
            dx.index_copy_(0, group.sentences, grad)
        return dx, None


class _Grids(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, rows):
        ctx.rows = rows
        return tuple(group.grid(x) for group in rows.groups)

    @staticmethod
    def backward(ctx, *grads):
        rows, n = ctx.rows, len(ctx.rows.index)
        _, h, _, d = grads[0].shape
        dx = grads[0].new_empty(n + rows.pad_rows, h, d)
        for group, grad in zip(rows.groups, grads):
            group.take(grad, dx[group.start:group.end])
        dx[n:].zero_()
        return dx, None


def _from_grids(rows, outs):
    _, h, _, d = outs[0].shape
    y = outs[0].new_empty(len(rows.index) + rows.pad_rows, h * d)
    for group, out in zip(rows.groups, outs):
        group.take(out, y[group.start:group.end])
    y[len(rows.index):].zero_()
    return y


class _FromGrids(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rows, *outs):
        ctx.rows, ctx.shapes = rows, [out.shape for out in outs]
        return _from_grids(rows, outs)

    @staticmethod
    def backward(ctx, grad):
        _, h, _, d = ctx.shapes[0]
        return (None, *(group.grid(grad.reshape(grad.size(0), h, d)) for group in ctx.rows.groups))


def layer_rows(layer, x, self_attention, cross_attention, ffn):
    """fairseq's TransformerDecoderLayerBase.forward on rows X (N, C), each sublayer given as a
    function of its (pre-)normalised input; CROSS_ATTENTION None: the layer has none."""
    return residual_sublayers(layer, x, ((layer.self_attn_layer_norm, self_attention),
                                         (layer.encoder_attn_layer_norm, cross_attention),
                                         (layer.final_layer_norm, ffn)))


def decoder_rows(decoder, prev_output_tokens, encoder_out):
    """DECODER's teacher-forced forward on the target's tokens only: (logits (N, V), extra), with
    extra["packed_rows"] the rows' index into the flat (batch, length) grid; with the decoder's
    vocabulary mask the logits are (N, V') and extra["packed_types"] maps a type to its column
    (-1: a type the mask forbids)."""
    rows = Rows(prev_output_tokens, decoder.padding_idx, decoder.packed_groups, padded=pads_rows(decoder))
    x = decoder.embed_scale * decoder.embed_tokens(prev_output_tokens)
    if decoder.embed_positions is not None:
        x = x + decoder.embed_positions(prev_output_tokens)
    x = rows.take(x)
    if decoder.layernorm_embedding is not None:
        x = decoder.layernorm_embedding(x)
    x = decoder.dropout_module(x)
    source, source_pad, source_rows = None, None, None
    if encoder_out and encoder_out.get("encoder_rows"):  # --packed-encoder's rows, right-padded on its grid
        source, source_rows = encoder_out["encoder_rows"][0], encoder_out["source_rows"][0]
        source_pad = source_rows.groups[0].key_pad
    elif encoder_out and encoder_out["encoder_out"]:
        source = encoder_out["encoder_out"][0]
        source_pad = encoder_out["encoder_padding_mask"][0] if encoder_out["encoder_padding_mask"] else None
    # each group's source padding, the same tensors in every layer (the attention's mask cache)
    source_pads = [None] * len(rows.groups) if source_pad is None else rows.split(source_pad)
    future = decoder.buffered_future_mask(x.new_empty(rows.length))
    for layer in decoder.layers:
        cross = None
        if layer.encoder_attn is not None and source is not None:
            def cross(h, attn=layer.encoder_attn):
                return attn.forward_rows(h, rows, key=source, key_padding_masks=source_pads, key_rows=source_rows)
        x = layer_rows(layer, x, lambda h, attn=layer.self_attn: attn.forward_rows(h, rows, attn_mask=future),
                       cross, lambda h, layer=layer: feed_forward(layer, h))
    if decoder.layer_norm is not None:
        x = decoder.layer_norm(x)
    n = len(rows.index)
    extra = {"attn": [None], "inner_states": [x[:n]], "packed_rows": rows.index}
    if not decoder.allowed_only:
        return decoder.output_layer(x)[:n], extra
    types, extra["packed_types"] = allowed_types(decoder)
    return allowed_logits(decoder, x, types)[:n], extra


def allowed_types(decoder):
    """(the types DECODER's mask allows (V',), each type's column among them or -1 (V,)), computed
    again only when the mask changes (a checkpoint's load writes it)."""
    mask = decoder.allowed_types
    key = (mask._version, mask.data_ptr(), mask.device)
    if getattr(decoder, "_allowed_cache", (None,))[0] != key:
        # decoder.train_types: the mask the model's build made from the training targets
        missing = int((decoder.train_types.to(mask.device) & ~mask).sum())
        if missing:
            raise ValueError(f"the target vocabulary mask (loaded from a checkpoint trained on other data) forbids "
                             f"{missing} of the training targets' types, to which --packed-decoder gives no logits: "
                             "train with --task translation_qk (which allows them), or drop --packed-decoder or "
                             "--target-vocab-mask")
        types = mask.nonzero().squeeze(1)
        column = torch.full(mask.shape, -1, dtype=torch.long, device=mask.device)
        column[types] = torch.arange(len(types), device=mask.device)
        decoder._allowed_cache = (key, types, column)
    return decoder._allowed_cache[1:]


def allowed_logits(decoder, x, types):
    """output_layer(X)[:, TYPES]: the output projection's rows of TYPES only, and the learned bias's."""
    projection = decoder.output_projection
    embedding = getattr(projection, "embedding", None)  # FixNorm's projection: the normalised matrix
    weight = embedding[0].normalized_weight() if embedding else projection.weight
    bias = getattr(projection, "bias", None)
    if decoder.output_bias is not None:
        bias = decoder.output_bias if bias is None else bias + decoder.output_bias
    linear = F.linear
    if decoder.fused_kernels:
        from .fused_kernels import linear  # imported only here: it imports torch._dynamo (2 s)
    return linear(x, weight.index_select(0, types), None if bias is None else bias.index_select(0, types))


def packed_extra(net_output):
    """The decoder's extra output (packed_rows, packed_types when the decoder ran on rows), or {}."""
    return net_output[1] if len(net_output) > 1 and isinstance(net_output[1], dict) else {}


def packed_targets(target, net_output):
    """The criterion's targets: TARGET (batch, length), or its rows when the decoder ran on rows, as
    columns of the allowed types when its logits hold those only."""
    extra = packed_extra(net_output)
    if "packed_rows" not in extra:
        return target
    target = target.reshape(-1).index_select(0, extra["packed_rows"])
    # every training target has a column (allowed_types checks the mask against them)
    return extra["packed_types"].index_select(0, target) if "packed_types" in extra else target
