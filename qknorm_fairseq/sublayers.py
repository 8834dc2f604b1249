"""A Transformer layer as residual sublayers: fairseq's TransformerEncoderLayerBase and
TransformerDecoderLayerBase forwards written once over (norm, sublayer) pairs, for the layers whose
forward this plugin runs itself (the packed decoder's rows, decoder_rows.py; the encoder with
--fast-dropout). With --fast-dropout's FastDropout the residual addition and the dropout before it,
and ReLU with the dropout after it, each run as one autograd function (fast_dropout.py)."""
import torch.nn.functional as F


def residual_sublayers(layer, x, sublayers):
    """X through LAYER's SUBLAYERS, (norm, function of the normalised input) pairs, None skipped:
    pre-norm or post-norm residual blocks as LAYER.normalize_before says."""
    sublayers = [(norm, sublayer) for norm, sublayer in sublayers if sublayer is not None]
    if not layer.normalize_before:
        for norm, sublayer in sublayers:
            x = norm(dropped_residual(layer.dropout_module, sublayer(x), x))
        return x
    following = [norm for norm, _ in sublayers[1:]] + [None]  # the norm after each sublayer's residual
    h = sublayers[0][0](x) if sublayers else x
    for (_, sublayer), norm in zip(sublayers, following):
        y = sublayer(h)
        after = getattr(norm, "after_dropout", None)  # --fused-kernels' LayerNorm: one pass with the dropout
        fused = after(layer.dropout_module, y, x) if after else None
        if fused:
            x, h = fused
        else:
            x = dropped_residual(layer.dropout_module, y, x)
            h = norm(x) if norm is not None else None
    return x


def dropped_residual(dropout, x, residual):
    """residual + dropout(x)"""
    add = getattr(dropout, "add", None)  # FastDropout's, in one pass
    return residual + dropout(x) if add is None else add(x, residual)


def feed_forward(layer, x):
    """fc2(activation_dropout(activation(fc1(x))))"""
    h = layer.fc1(x)
    relu = getattr(layer.activation_dropout_module, "relu", None)  # FastDropout's, in one pass
    if relu is not None and layer.activation_fn is F.relu:
        return layer.fc2(relu(h))
    return layer.fc2(layer.activation_dropout_module(layer.activation_fn(h)))
