"""SmallInit (TwT section 3.1) and its Xavier-normal baseline (TwT Table 2): the initialisation of
a Transformer layer's attention projections and FFN.

TwT Eq. 4: std sqrt(2 / (d_in + d_out)). The attention projections get sqrt(2 / (DENOM * d)):
SmallInit uses d + 4d (the FFN's scale), Xavier normal d + d. The FFN is N(0, sqrt(2/(d+d_ff))) in
both. Biases start at zero.
"""
import math

from torch import nn

# --init-scheme NAME -> DENOM of the attention projections' std; None: fairseq's init, left as it is
INIT_SCHEMES = {"fairseq": None, "smallinit": 5, "xavier_normal": 2}


def attention_std(scheme, embed_dim):
    return math.sqrt(2.0 / (INIT_SCHEMES[scheme] * embed_dim))


def init_attention(attn, std):
    """N(0, std) for the attention projections, zero biases."""
    for proj in (attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj):
        nn.init.normal_(proj.weight, mean=0.0, std=std)
        if proj.bias is not None:
            nn.init.zeros_(proj.bias)


def init_ffn(layer):
    d, d_ff = layer.fc1.in_features, layer.fc1.out_features
    std = math.sqrt(2.0 / (d + d_ff))
    for fc in (layer.fc1, layer.fc2):
        nn.init.normal_(fc.weight, mean=0.0, std=std)
        nn.init.zeros_(fc.bias)


def init_layer(layer, attns, scheme):
    """Re-initialise a built encoder or decoder layer by `scheme` ("fairseq" keeps fairseq's init).
    Called once the layer is built, attentions first, then the FFN: a seed gives the same weights
    as it always has."""
    if INIT_SCHEMES[scheme] is None:
        return
    for attn in attns:
        if attn is not None:
            init_attention(attn, attention_std(scheme, layer.embed_dim))
    init_ffn(layer)
