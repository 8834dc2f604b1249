"""The flags of `qknorm_transformer`, declared once (in the style of fairseq's TransformerConfig),
and `fill`, the one helper through which the model and every preset set their defaults."""
from dataclasses import dataclass, field, fields
from typing import Optional

from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.dataclass.utils import gen_parser_from_dataclass

from .attention import ATTENTIONS
from .norms import NORMS
from .positions import POSITIONS
from .smallinit import INIT_SCHEMES

SITES = {"encoder": "encoder self-attention", "decoder": "decoder self-attention", "cross": "encoder-decoder attention"}
ATTENTION_HELP = ("attention in {}. qknorm: l_p-normalised q and k with a learned scale g; "
                  "dnas/hnas (encoder only): doubly-normalised/hybrid weights over dot-product scores, "
                  "qknorm+dnas/qknorm+hnas over QKNorm scores")


@dataclass
class QKNormConfig(FairseqDataclass):
    """Every default gives fairseq's own transformer."""

    norm_type: ChoiceEnum(list(NORMS)) = field(
        default="layernorm", metadata={"help": "normalisation in every sublayer and the final norms"})
    scalenorm_fixed_g: bool = field(
        default=False, metadata={"help": "ScaleNorm: keep g fixed at sqrt(d) except in the final decoder norm "
                                         "(TwT Table 7)"})
    fixnorm: bool = field(
        default=False, metadata={"help": "FixNorm: l2-normalised tied embeddings, U(-0.01, 0.01) init (needs "
                                         "--share-all-embeddings)"})
    init_scheme: ChoiceEnum(list(INIT_SCHEMES)) = field(
        default="fairseq", metadata={"help": "smallinit: attention N(0, sqrt(2/5d)), FFN N(0, sqrt(2/(d+d_ff))) "
                                             "(TwT 3.1); xavier_normal: attention N(0, sqrt(2/2d)), FFN as smallinit "
                                             "(TwT Table 2 baseline); fairseq: fairseq's Xavier uniform init"})
    encoder_attention: ChoiceEnum(list(ATTENTIONS)) = field(
        default="softmax", metadata={"help": ATTENTION_HELP.format(SITES["encoder"])})
    decoder_attention: ChoiceEnum(list(ATTENTIONS)) = field(
        default="softmax", metadata={"help": ATTENTION_HELP.format(SITES["decoder"])})
    cross_attention: ChoiceEnum(list(ATTENTIONS)) = field(
        default="softmax", metadata={"help": ATTENTION_HELP.format(SITES["cross"])})
    qknorm_p: float = field(default=2.0, metadata={"help": "p of the l_p norm in QKNorm, p >= 1"})
    qknorm_length: Optional[float] = field(
        default=None, metadata={"help": "L for QKNorm's g0 = log2(L^2 - L); unset: the --qknorm-percentile of the "
                                        "train split's source and target lengths in the data directory"})
    qknorm_g0: Optional[float] = field(
        default=None, metadata={"help": "QKNorm's initial g, overriding --qknorm-length"})
    qknorm_percentile: float = field(default=97.5, metadata={"help": "percentile of training lengths used as L"})
    word_dropout: float = field(
        default=0.0, metadata={"help": "probability of replacing a source or target input token by <unk> in training"})
    word_dropout_specials: bool = field(
        default=False, metadata={"help": "word dropout may also replace EOS and BOS (every non-pad token), as both "
                                         "original code bases do; without it only ordinary tokens"})
    language_embeddings: bool = field(
        default=False, metadata={"help": "add a learned vector, N(0, d^-0.5) at init, to every source input embedding and "
                                         "another to every target one: both original code bases' language embedding, "
                                         "one language a side (qknorm_fairseq/language_embedding.py)"})
    target_vocab_mask: bool = field(
        default=False, metadata={"help": "set to -inf the logits of types never seen on the target side of the "
                                         "train split (use with --criterion masked_label_smoothed_cross_entropy); saved with "
                                         "the model; with --task translation_qk a training from a checkpoint (resumed "
                                         "or fine-tuned on other data) allows the checkpoint's types and its own"})
    output_bias: bool = field(
        default=False, metadata={"help": "a learned, zero-initialised bias on the output logits, as in both "
                                         "original code bases"})
    fast_dropout: bool = field(
        default=False, metadata={"help": "dropout masks from 16-bit random draws (on a CPU numpy's PCG64DXSM, "
                                         "seeded from torch's generator at every mask) instead of torch's "
                                         "bernoulli_ (faster: benchmark.sh kernels); the same distribution, another "
                                         "random stream; a residual's dropout and addition in one op (one rounding), "
                                         "ReLU and its dropout in one autograd function; on a CPU each of these one C loop, built on "
                                         "first use by the C compiler, the same bits (qknorm_fairseq/fast_dropout.py)"})
    attention_kernel: ChoiceEnum(["sdpa", "matmul"]) = field(
        default="sdpa", metadata={"help": "softmax attention through torch's scaled_dot_product_attention (sdpa: "
                                          "fused kernels) or as matmul, softmax, matmul (on a CPU in bf16 0.17x sdpa's "
                                          "time, forward and backward: benchmark.sh kernels; another rounding)"})
    fused_kernels: bool = field(
        default=False, metadata={"help": "in training, QKNorm's normalisation and --fused-loss's passes over the "
                                         "logits each run as one loop compiled by torch.compile (a C++ compiler on "
                                         "a CPU; a few seconds' compiling the first time), on a CPU the l2 "
                                         "normalisation and the loss's passes as C loops instead, the attention's "
                                         "mask, softmax and "
                                         "dropout (--fast-dropout's, or none) one C loop, and LayerNorm C loops "
                                         "(pre-norm: with --fast-dropout's residual dropout before it), and bf16 "
                                         "linear layers with the bias inside oneDNN's product; in beam search on a "
                                         "CPU, a decoding step's attention one C loop over the cached keys; the "
                                         "same formulas, another rounding (qknorm_fairseq/fused_kernels.py, step_attention.py)"})
    packed_decoder: bool = field(
        default=False, metadata={"help": "in training, the decoder computes its target's tokens only, not the "
                                         "padding: embeddings, norms, projections, feed-forward layers and output "
                                         "layer on one row per token (on a CPU in bf16 up to 1/16 more, so that a "
                                         "batch's row count is one of a few), only the attention cores padded; with "
                                         "--target-vocab-mask and masked_label_smoothed_cross_entropy the logits "
                                         "and loss of the allowed types only (the same loss and gradient up to "
                                         "rounding; qknorm_fairseq/decoder_rows.py)"})
    packed_encoder: bool = field(
        default=False, metadata={"help": "in training, the encoder computes its source's tokens only, not the "
                                         "padding, as --packed-decoder the decoder (its attention cores on one "
                                         "grid a batch); with --packed-decoder the encoder-decoder attention "
                                         "projects its keys and values from those rows (the same loss and "
                                         "gradient up to rounding; qknorm_fairseq/encoder_rows.py)"})
    packed_groups: int = field(
        default=3, metadata={"help": "with --packed-decoder, the attention cores of a batch run on the grids of at "
                                     "most N (1, 2 or 3) groups of sentences of similar target length, each "
                                     "trimmed to its longest sentence (1: one grid per batch)"})
    positions: ChoiceEnum(list(POSITIONS)) = field(
        default="fairseq", metadata={"help": "the fixed sinusoidal position table: fairseq's (sin half, cos half); "
                                             "twt: the TwT code's (sin on even, cos on odd dimensions); qknorm: the "
                                             "QKNorm code's (sin on every dimension; qknorm_fairseq/positions.py)"})

    def _get_help(self, attribute_name):
        return f"{super()._get_help(attribute_name)} (default: {self._get_default(attribute_name)})"


FLAGS = [f for f in fields(QKNormConfig) if not f.name.startswith("_")]  # FairseqDataclass adds _name
DEFAULTS = {f.name: f.default for f in FLAGS}


def add_args(parser):
    """The flags of QKNormConfig as fairseq makes them, plus --no-FLAG for every boolean (a preset
    sets some), fairseq's two PreNorm flags included. No argparse defaults: a flag left out is unset,
    so that a preset can fill it."""
    group = parser.add_argument_group("qknorm-fairseq: normalisation, attention and the original code's details")
    gen_parser_from_dataclass(group, QKNormConfig(), delete_default=True)
    for f in FLAGS:
        if f.type is bool:
            flag = f.name.replace("_", "-")
            group.add_argument(f"--no-{flag}", dest=f.name, action="store_false", help=f"turn --{flag} off")
    for side in ("encoder", "decoder"):
        group.add_argument(f"--no-{side}-normalize-before", dest=f"{side}_normalize_before", action="store_false",
                           help=f"PostNorm in the {side}, also under a PreNorm preset")


def fill(args, **defaults):
    """Set each default that the command line (or a preset applied before) left unset, as
    fairseq's architecture functions do."""
    for key, value in defaults.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
