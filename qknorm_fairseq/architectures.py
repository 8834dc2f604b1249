"""Named presets of `qknorm_transformer`: one per row of the papers' tables.

A preset only sets defaults; every flag can still be overridden on the command line. Sizes are
fairseq's transformer (d=512, d_ff=2048, 6+6 layers, 8 heads) with TwT's dropout 0.3 everywhere;
per-pair sizes (gl->en: 4+4 layers, 4 heads, dropout 0.4) live in configs/.
"""
from fairseq.models import ARCH_MODEL_INV_REGISTRY, register_model_architecture
from fairseq.models.transformer.transformer_legacy import base_architecture

from .config import DEFAULTS, fill


@register_model_architecture("qknorm_transformer", "qknorm_transformer")
def qknorm_transformer(args):
    """All flags at fairseq's defaults: the same network as fairseq's `transformer`."""
    fill(args, **DEFAULTS)
    base_architecture(args)


def twt_common(args, prenorm):
    # TwT Appendix A: same dropout on sublayer outputs, ReLU and attention weights; tied
    # source/target/output embeddings; word dropout 0.1; output masked to the target vocabulary.
    # Both original code bases add a learned bias to the output logits (use_bias).
    fill(args, dropout=0.3, attention_dropout=0.3, activation_dropout=0.3, share_all_embeddings=True,
         word_dropout=0.1, target_vocab_mask=True, init_scheme="smallinit", output_bias=True,
         encoder_normalize_before=prenorm, decoder_normalize_before=prenorm)
    qknorm_transformer(args)


@register_model_architecture("qknorm_transformer", "transformer_postnorm")
def transformer_postnorm(args):
    """TwT Table 3 row 'PostNorm + LayerNorm' (the baseline, with SmallInit)."""
    twt_common(args, prenorm=False)


@register_model_architecture("qknorm_transformer", "transformer_prenorm")
def transformer_prenorm(args):
    """TwT Table 3 row 'PreNorm + LayerNorm'."""
    twt_common(args, prenorm=True)


@register_model_architecture("qknorm_transformer", "transformer_fixnorm")
def transformer_fixnorm(args):
    """TwT Table 3 row 'PreNorm + FixNorm + LayerNorm'."""
    fill(args, fixnorm=True)
    twt_common(args, prenorm=True)


@register_model_architecture("qknorm_transformer", "transformer_scalenorm")
def transformer_scalenorm(args):
    """TwT Table 3 row 'PreNorm + FixNorm + ScaleNorm' ("Transformers without Tears")."""
    fill(args, norm_type="scalenorm")
    transformer_fixnorm(args)


@register_model_architecture("qknorm_transformer", "transformer_scalenorm_fixed_g")
def transformer_scalenorm_fixed_g(args):
    """TwT Table 7 row 'fixed g': ScaleNorm with g = sqrt(d) except in the final decoder norm."""
    fill(args, scalenorm_fixed_g=True)
    transformer_scalenorm(args)


@register_model_architecture("qknorm_transformer", "transformer_rmsnorm")
def transformer_rmsnorm(args):
    """TwT Table 7 row 'RMSNorm': PreNorm + FixNorm with RMSNorm in place of ScaleNorm."""
    fill(args, norm_type="rmsnorm")
    transformer_fixnorm(args)


@register_model_architecture("qknorm_transformer", "transformer_qknorm")
def transformer_qknorm(args):
    """QKNorm Tables 2/3 row 'QKNorm + LayerNorm': PreNorm + FixNorm + LayerNorm, QKNorm in all
    three attentions, g0 = log2(L^2 - L)."""
    fill(args, encoder_attention="qknorm", decoder_attention="qknorm", cross_attention="qknorm")
    transformer_fixnorm(args)


@register_model_architecture("qknorm_transformer", "transformer_lpqknorm")
def transformer_lpqknorm(args):
    """Lp-QKNorm (Lopez-Rubio et al.): QKNorm with the l_p norm; p = 4 by default, the best value
    of that paper's experiment (p in {2.5, 3, 3.5, 4} all beat p = 2 there). Set --qknorm-p."""
    fill(args, qknorm_p=4.0)
    transformer_qknorm(args)


@register_model_architecture("qknorm_transformer", "transformer_dnas")
def transformer_dnas(args):
    """PreNorm + FixNorm + LayerNorm with doubly-normalised attention (DNAS) in encoder
    self-attention over scaled dot-product scores."""
    fill(args, encoder_attention="dnas")
    transformer_fixnorm(args)


@register_model_architecture("qknorm_transformer", "transformer_hnas")
def transformer_hnas(args):
    """As transformer_dnas with hybrid attention (HNAS): u * DNAS + (1 - u) * softmax, u learned
    per encoder layer, initialised to 0.5."""
    fill(args, encoder_attention="hnas")
    transformer_fixnorm(args)


# Every preset registered above, in that order (the benchmark and the tests go through them all).
PRESETS = tuple(ARCH_MODEL_INV_REGISTRY["qknorm_transformer"])
