"""The encoder on rows of tokens: `--packed-encoder` in training, as decoder_rows.py runs the decoder.

fairseq's encoder computes every position of a (source length, batch) grid, pads included. With
--packed-encoder its embeddings' rows are taken at the source's tokens (decoder_rows.Rows, one
length group: a batch's sources are sorted by length, so one grid pads little) and every
position-wise op (norms, projections, feed-forward layers, dropout) runs on those rows; only the
self-attention cores see the (sentences, length) grid. On a CPU in bf16 (or fp16) the rows go on to one
of a few counts (decoder_rows.padded_size, pads_rows): oneDNN builds a kernel for each matrix-product shape it
meets, milliseconds each, and a batch's source length x sentences is new at most batches of epoch 1.

With --packed-decoder the encoder-decoder attention projects its keys and values from these rows
too (the same row counts) and reads them on the source's grid; without it the decoder gets fairseq's
(source length, batch, embed) output, zeros at the pads (which are masked keys). The loss and its
gradients are those of the padded encoder up to rounding; dropout draws masks of another shape, so
a run is not the bit-for-bit twin of one without the flag.
"""
import torch

from .decoder_rows import Rows, pads_rows
from .sublayers import feed_forward, residual_sublayers


def layer_rows(layer, x, rows):
    """fairseq's TransformerEncoderLayerBase.forward on rows X (N, C)."""
    return residual_sublayers(layer, x, ((layer.self_attn_layer_norm, lambda h: layer.self_attn.forward_rows(h, rows)),
                                         (layer.final_layer_norm, lambda h: feed_forward(layer, h))))


def encoder_rows(encoder, src_tokens, grid=True):
    """ENCODER's training forward on the source's tokens only: fairseq's encoder_out dict, with
    "encoder_rows" the rows (N + padding rows, C) and "source_rows" their Rows; "encoder_out" the
    (src_len, bsz, C) grid only with GRID (the packed decoder reads the rows)."""
    rows = Rows(src_tokens, encoder.padding_idx, max_groups=1, padded=pads_rows(encoder))
    x, embedding = encoder.forward_embedding(src_tokens)
    x = rows.take(x)
    for layer in encoder.layers:
        x = layer_rows(layer, x, rows)
    if encoder.layer_norm is not None:
        x = encoder.layer_norm(x)
    pad = src_tokens.eq(encoder.padding_idx)
    lengths = src_tokens.ne(encoder.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1)
    return {"encoder_out": [source_grid(x, rows)] if grid else [], "encoder_padding_mask": [pad],
            "encoder_embedding": [embedding], "encoder_states": [], "fc_results": [], "src_tokens": [],
            "src_lengths": [lengths], "encoder_rows": [x], "source_rows": [rows]}


def source_grid(x, rows):
    """Rows X -> fairseq's encoder output (src_len, bsz, C), zeros at the pads."""
    bsz, length = rows.bsz, rows.length
    at = rows.index % length * bsz + rows.index // length  # each token's place in the (src_len, bsz) grid
    out = x.new_zeros(length * bsz, x.size(1)).index_copy(0, at, x[:len(rows.index)])
    return out.view(length, bsz, -1)
