"""`qknorm_transformer`: fairseq's Transformer with orthogonal normalisation flags.

Every behaviour is composed through fairseq's build hooks (build_embedding, build_encoder,
build_decoder, build_*_layer, build_self_attention, build_encoder_attention,
build_output_projection). Two forwards of fairseq are restated: the encoder's, without its per-layer
host sync (QKEncoder.forward_scriptable), and the decoder's on rows of tokens for --packed-decoder
(decoder_rows.py).
"""
import hashlib
import logging

import torch
from fairseq.distributed import fsdp_wrap
from fairseq.models import register_model
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase, TransformerModel
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase
from torch import nn

from . import config, criterion, data_stats, distributed
from .attention import ATTENTIONS, NormAttention
from .decoder_rows import decoder_rows, fairseq_extras, packed_targets
from .encoder_rows import encoder_rows
from .fixnorm import FixNormEmbedding, FixNormOutputProjection, shared_fixnorm
from .language_embedding import add_language_embedding
from .norms import NORMS
from .positions import POSITIONS, build_positions
from .smallinit import init_layer
from .sublayers import feed_forward, residual_sublayers

logger = logging.getLogger(__name__)

def check_args(args):
    """Reject combinations that cannot work or flags that would do nothing, with the reason; returns
    the attention sites that use QKNorm scores."""
    for site in ("decoder", "cross"):
        kind = getattr(args, f"{site}_attention")
        if ATTENTIONS[kind][1] != "softmax":
            raise ValueError(
                f"--{site}-attention {kind}: DNAS/HNAS normalise over queries, so in the decoder they would "
                "let every position see future target tokens and could not run step by step in beam search; "
                "use them in --encoder-attention only")
    uses_qknorm = [s for s in config.SITES if ATTENTIONS[getattr(args, f"{s}_attention")][0] == "qknorm"]
    qknorm = "a QKNorm attention (--encoder/decoder/cross-attention qknorm...)"
    # not --qknorm-length: the recipes give every system the paper's L (--paper-qknorm-length)
    needs = {"scalenorm_fixed_g": (args.norm_type == "scalenorm", "--norm-type scalenorm"),
             "word_dropout_specials": (args.word_dropout > 0, "--word-dropout P (P > 0)"),
             "packed_groups": (args.packed_decoder, "--packed-decoder"),
             **{name: (uses_qknorm, qknorm) for name in ("qknorm_p", "qknorm_g0", "qknorm_percentile")}}
    for name, (used, what) in needs.items():
        if not used and getattr(args, name) != config.DEFAULTS[name]:
            raise ValueError(f"--{name.replace('_', '-')} has no effect without {what}: drop it or use {what}")
    if uses_qknorm and not args.qknorm_p >= 1:
        raise ValueError(f"--qknorm-p {args.qknorm_p}: the l_p 'norm' is not a norm for p < 1; use p >= 1")
    if not 0 < args.qknorm_percentile <= 100:
        raise ValueError(f"--qknorm-percentile {args.qknorm_percentile} must be in (0, 100]")
    if args.packed_groups not in (1, 2, 3):
        raise ValueError(f"--packed-groups {args.packed_groups}: the packed decoder's attention runs in 1, 2 or 3 "
                         "groups a batch; use one of those")
    if not 0 <= args.word_dropout < 1:
        raise ValueError(f"--word-dropout {args.word_dropout} must be in [0, 1)")
    if args.fixnorm and not args.share_all_embeddings:
        raise ValueError("--fixnorm ties source, target and output embeddings: add --share-all-embeddings "
                         "(and binarize with fairseq-preprocess --joined-dictionary)")
    if args.output_bias and getattr(args, "adaptive_softmax_cutoff", None):
        raise ValueError("--output-bias adds one bias per type to full-vocabulary logits: it does not combine "
                         "with --adaptive-softmax-cutoff")
    fairseqs = str(getattr(args, "criterion", None) or "")
    if args.target_vocab_mask and fairseqs.startswith("label_smoothed_cross_entropy"):  # and its _with_* forms
        raise ValueError(f"--target-vocab-mask puts -inf logits into fairseq's label smoothing (--criterion {fairseqs}), "
                         "which then sums them: use --criterion masked_label_smoothed_cross_entropy")
    return uses_qknorm


def _train_data(task, args):
    """(data folder, source, target, training split) of the run, as fairseq-train reads them."""
    data = task.cfg.data.split(":")[0]
    return data, task.cfg.source_lang, task.cfg.target_lang, getattr(args, "train_subset", "train")


def _from_checkpoint(task):
    """Whether TASK builds the model to load a checkpoint into (translation_qk says; another task may be
    loading one, so its data is not required)."""
    return getattr(task, "building_from_checkpoint", True)


def resolve_qknorm_g0(args, task):
    if args.qknorm_g0 is not None:
        logger.info(f"{distributed.rank_tag()}QKNorm g0 = {args.qknorm_g0:.4f} (given by --qknorm-g0)")
        return args.qknorm_g0
    if args.qknorm_length is not None:
        g0 = data_stats.g0_from_length(args.qknorm_length)
        logger.info(f"{distributed.rank_tag()}QKNorm g0 = {g0:.4f} from --qknorm-length L = "
                    f"{args.qknorm_length:g}")
        return g0
    data, src, tgt, split = _train_data(task, args)
    try:
        length = data_stats.length_percentile(data, src, tgt, args.qknorm_percentile, split)
    except FileNotFoundError as e:
        if not _from_checkpoint(task):
            raise ValueError(f"{e}: QKNorm's g0 comes from its lengths; binarize it (fairseq-preprocess), or give "
                             "--qknorm-length L or --qknorm-g0 G") from None
        # an older checkpoint without its g0: g is a learned parameter and comes from the checkpoint
        logger.warning(f"{e}: QKNorm g0 left at 1.0 (the checkpoint's g will be loaded)")
        return 1.0
    g0 = data_stats.g0_from_length(length)
    logger.info(f"{distributed.rank_tag()}QKNorm g0 = {g0:.4f} from L = {length:.2f}, "
                f"the {args.qknorm_percentile:g}th percentile of "
                f"source and target lengths of the train split in {data}")
    return g0


def target_vocab(task, args):
    """Boolean (V,) of the types allowed at the output: those in the train targets, plus EOS."""
    data, src, tgt, split = _train_data(task, args)
    allowed = torch.ones(len(task.target_dictionary), dtype=torch.bool)
    try:
        types = data_stats.token_types(data_stats.split_prefix(data, split, src, tgt, tgt))
    except FileNotFoundError as e:
        if not _from_checkpoint(task):
            raise ValueError(f"{e}: the target vocabulary mask (--target-vocab-mask) comes from its target side; "
                             "binarize it (fairseq-preprocess), or add --no-target-vocab-mask") from None
        logger.warning(f"{e}: the target vocabulary mask comes from the checkpoint")
        return allowed
    allowed[:] = False
    allowed[torch.from_numpy(types)] = True
    allowed[task.target_dictionary.eos()] = True
    logger.info(f"{distributed.rank_tag()}target vocabulary mask: {int(allowed.sum())} of {len(allowed)} types "
                "can be generated")
    return allowed


# --- layers -------------------------------------------------------------------------------------

def _swap_norms(module, names, cfg, learnable=True):
    for name in names:
        old = getattr(module, name, None)
        if old is not None and NORMS[cfg.norm_type] is not None:
            setattr(module, name, NORMS[cfg.norm_type](old.normalized_shape[0], learnable))
        elif old is not None and getattr(cfg, "fused_kernels", False):
            from .fused_kernels import RowsLayerNorm  # imported only here: it imports torch._dynamo (2 s)

            RowsLayerNorm.swap(old)


def _swap_linears(layer, cfg):
    if cfg.fused_kernels:
        from .fused_kernels import RowsLinear  # imported only here, as above

        RowsLinear.swap(layer.fc1)
        RowsLinear.swap(layer.fc2)


def _swap_positions(module, cfg, max_positions):
    if POSITIONS[cfg.positions] is not None and module.embed_positions is not None:
        if cfg.encoder.learned_pos or cfg.decoder.learned_pos:
            raise ValueError(f"--positions {cfg.positions} is a fixed table: drop --encoder/decoder-learned-pos")
        dim = module.embed_positions.embedding_dim
        module.embed_positions = build_positions(cfg.positions, max_positions, dim, module.padding_idx)


def _wrap(layer, cfg):
    # as fairseq's build_*_layer: optional activation checkpointing and FSDP wrapping
    if cfg.checkpoint_activations:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not cfg.checkpoint_activations else 0)


def _attention(cfg, embed_dim, heads, kind, **kw):
    return NormAttention(embed_dim, heads, dropout=cfg.attention_dropout, attention_type=kind,
                         qknorm_p=cfg.qknorm_p, qknorm_g0=cfg.qknorm_g0, fast_dropout=cfg.fast_dropout,
                         attention_kernel=cfg.attention_kernel, fused_kernels=cfg.fused_kernels, **kw)


def _swap_dropouts(module, cfg):
    if cfg.fast_dropout:
        # imported only with the flag: its torch.compiler.disable imports torch._dynamo, 2 s of every
        # process that loads the plugin (fairseq-generate, interactive, validate never need it)
        from .fast_dropout import swap_dropouts

        swap_dropouts(module)


class QKEncoderLayer(TransformerEncoderLayerBase):
    def __init__(self, cfg, return_fc=False):
        super().__init__(cfg, return_fc)
        _swap_norms(self, ("self_attn_layer_norm", "final_layer_norm"), cfg, not cfg.scalenorm_fixed_g)
        _swap_dropouts(self, cfg)
        _swap_linears(self, cfg)
        init_layer(self, (self.self_attn,), cfg.init_scheme)

    def build_self_attention(self, embed_dim, cfg):
        return _attention(cfg, embed_dim, cfg.encoder.attention_heads, cfg.encoder_attention, self_attention=True)

    def forward(self, x, encoder_padding_mask, attn_mask=None):
        if not hasattr(self.dropout_module, "add") or attn_mask is not None or self.return_fc:
            return super().forward(x, encoder_padding_mask, attn_mask)

        # fairseq's forward, as sublayers: --fast-dropout's fused passes (sublayers.py), whose C loops take
        # the residual stream in memory order; the encoder hands the first layer a transposed view, which
        # would stay one through every layer (and cost each sublayer's reshape a copy)
        x = x.contiguous()

        def attend(h):
            return self.self_attn(query=h, key=h, value=h, key_padding_mask=encoder_padding_mask, need_weights=False)[0]

        return residual_sublayers(self, x, ((self.self_attn_layer_norm, attend),
                                            (self.final_layer_norm, lambda h: feed_forward(self, h))))


class QKDecoderLayer(TransformerDecoderLayerBase):
    def __init__(self, cfg, no_encoder_attn=False, add_bias_kv=False, add_zero_attn=False):
        super().__init__(cfg, no_encoder_attn, add_bias_kv, add_zero_attn)
        _swap_norms(self, ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"), cfg,
                    not cfg.scalenorm_fixed_g)
        _swap_dropouts(self, cfg)
        _swap_linears(self, cfg)
        init_layer(self, (self.self_attn, self.encoder_attn), cfg.init_scheme)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if add_bias_kv or add_zero_attn or cfg.cross_self_attention:
            raise ValueError("qknorm_transformer does not support add_bias_kv, add_zero_attn or "
                             "--cross-self-attention")
        return _attention(cfg, embed_dim, cfg.decoder.attention_heads, cfg.decoder_attention,
                          self_attention=True, causal=True)

    def build_encoder_attention(self, embed_dim, cfg):
        return _attention(cfg, embed_dim, cfg.decoder.attention_heads, cfg.cross_attention,
                          kdim=cfg.encoder.embed_dim, vdim=cfg.encoder.embed_dim, encoder_decoder_attention=True)


def rows_problem(decoder):
    """Why DECODER cannot run on rows of tokens (decoder_rows.py), None if it can."""
    if not decoder.layers or not all(isinstance(layer, QKDecoderLayer) for layer in decoder.layers):
        return "its decoder layers are not qknorm_transformer's (fairseq's own, or wrapped)"
    return fairseq_extras(decoder)


def encoder_rows_problem(encoder, cfg):
    """Why ENCODER cannot run on rows of tokens (encoder_rows.py), None if it can."""
    if cfg.checkpoint_activations:
        return "--checkpoint-activations wraps its layers"
    if not all(isinstance(layer, QKEncoderLayer) for layer in encoder.layers):
        return "its encoder layers are not qknorm_transformer's (fairseq's own, or wrapped)"
    if encoder.return_fc:
        return "its layers return their feed-forward outputs (return_fc)"
    return None


# --- encoder and decoder ------------------------------------------------------------------------

class QKEncoder(TransformerEncoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc)
        _swap_norms(self, ("layer_norm",), cfg, not cfg.scalenorm_fixed_g)
        _swap_positions(self, cfg, cfg.max_source_positions)
        add_language_embedding(self, cfg)
        _swap_dropouts(self, cfg)
        self.packed = bool(cfg.packed_encoder)
        problem = self.packed and encoder_rows_problem(self, cfg)
        if problem:
            raise ValueError(f"--packed-encoder cannot run this encoder: {problem}; drop --packed-encoder")

    def build_encoder_layer(self, cfg):
        return _wrap(QKEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward_scriptable(self, src_tokens, src_lengths=None, return_all_hiddens=False, token_embeddings=None):
        # fairseq's forward, less its `has_pads = encoder_padding_mask.any()`, tested before every
        # layer (a host-device sync each) to pass None instead of an all-False mask: the mask is
        # always passed here, which changes no result (masking nothing adds zeros).
        encoder_padding_mask = src_tokens.eq(self.padding_idx)
        x, encoder_embedding = self.forward_embedding(src_tokens, token_embeddings)
        x = (x * (1 - encoder_padding_mask.unsqueeze(-1).type_as(x))).transpose(0, 1)
        encoder_states, fc_results = ([x] if return_all_hiddens else []), []
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=encoder_padding_mask)
            x, fc_result = x if isinstance(x, tuple) and len(x) == 2 else (x, None)
            if return_all_hiddens:
                encoder_states.append(x)
                fc_results.append(fc_result)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        src_lengths = src_tokens.ne(self.padding_idx).sum(dim=1, dtype=torch.int32).reshape(-1, 1).contiguous()
        return {"encoder_out": [x], "encoder_padding_mask": [encoder_padding_mask],
                "encoder_embedding": [encoder_embedding], "encoder_states": encoder_states,
                "fc_results": fc_results, "src_tokens": [], "src_lengths": [src_lengths]}


class QKDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn, output_projection)
        _swap_norms(self, ("layer_norm",), cfg, learnable=True)  # the final norm's g always learns
        _swap_positions(self, cfg, cfg.max_target_positions)
        add_language_embedding(self, cfg)
        _swap_dropouts(self, cfg)
        self.mask_output = bool(cfg.target_vocab_mask)
        if self.mask_output:
            # (V,) True where the type may be generated; persistent, so decoding needs no train data.
            # Registered only with the mask, so that stock fairseq state dicts load unchanged.
            self.register_buffer("allowed_types", torch.ones(len(dictionary), dtype=torch.bool))
        # both original code bases: logits = h . W^T + b, b learned and zero-initialised
        self.output_bias = nn.Parameter(torch.zeros(len(dictionary))) if cfg.output_bias else None
        self.packed, self.packed_groups = bool(cfg.packed_decoder), cfg.packed_groups
        self.allowed_only = False  # set by the model's build_model
        self.train_types = None  # the mask build_model made from the training targets
        self.widen_loaded_mask = False  # set by build_model when it builds a model to train
        self.fused_kernels = bool(cfg.fused_kernels)  # read by the criterion's --fused-loss
        if self.packed:
            problem = rows_problem(self) or (cfg.checkpoint_activations and "--checkpoint-activations wraps its layers")
            if problem:
                raise ValueError(f"--packed-decoder cannot run this decoder: {problem}; drop --packed-decoder")

    @property
    def cross_self_attention(self):
        # Read once, by fairseq's extract_features_scriptable: `if self.cross_self_attention or
        # prev_output_tokens.eq(pad).any()` builds the self-attention padding mask, and the .any()
        # is a host-device sync in every forward. True in training builds the mask always (an
        # all-False mask changes no result); decoding keeps fairseq's test. Our layers reject real
        # cross-self-attention (build_self_attention), so nothing else reads this.
        return self.training

    @cross_self_attention.setter
    def cross_self_attention(self, value):  # fairseq's __init__ assigns cfg.cross_self_attention
        pass

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return _wrap(QKDecoderLayer(cfg, no_encoder_attn), cfg)

    def build_output_projection(self, cfg, dictionary, embed_tokens):
        if cfg.fixnorm:
            self.output_projection = FixNormOutputProjection(embed_tokens)
        else:
            super().build_output_projection(cfg, dictionary, embed_tokens)

    def output_layer(self, features):
        return self.finish_logits(super().output_layer(features), *self.logit_terms())

    def logit_terms(self):
        """(bias, blocked) that finish_logits applies to the output projection: the learned bias and the
        types the mask blocks, each None when absent. With both, the mask is folded into the (V,) bias
        (one pass over tokens x types instead of two) and blocked is None."""
        blocked = ~self.allowed_types if self.mask_output else None
        if self.output_bias is not None and blocked is not None:
            return self.output_bias.masked_fill(blocked, float("-inf")), None
        return self.output_bias, blocked

    @staticmethod
    def finish_logits(logits, bias, blocked):
        if bias is not None:
            logits = logits + bias
        if blocked is not None:
            logits = logits.masked_fill(blocked, float("-inf"))
        return logits

    def upgrade_state_dict_named(self, state_dict, name):
        state_dict = super().upgrade_state_dict_named(state_dict, name)
        prefix = f"{name}." if name else ""
        if self.output_bias is not None and prefix + "output_bias" not in state_dict:
            # a checkpoint from before --output-bias: a zero bias gives the same logits
            state_dict[prefix + "output_bias"] = torch.zeros_like(self.output_bias)
        if not self.mask_output:
            # checkpoints from before the buffer was conditional carry an all-True mask
            state_dict.pop(prefix + "allowed_types", None)
        elif self.widen_loaded_mask and prefix + "allowed_types" in state_dict:
            state_dict[prefix + "allowed_types"] = self.training_mask(state_dict[prefix + "allowed_types"])
        return state_dict

    def training_mask(self, loaded):
        """The mask a training goes on with from a checkpoint's mask LOADED: the types it allows and those of
        this training's targets (a resume: the same mask; fine-tuning on other data: its new types too, which
        the checkpoint's mask alone would give -inf logits and no gradient)."""
        new = int((self.train_types & ~loaded.to(self.train_types.device)).sum())
        if not new:
            return loaded
        mask = loaded.to(self.train_types.device) | self.train_types
        logger.info(f"{distributed.rank_tag()}target vocabulary mask: the checkpoint's {int(loaded.sum())} types and "
                    f"{new} more from the training targets, {int(mask.sum())} of {len(mask)} types can be generated")
        return mask.to(loaded.device)


# --- model --------------------------------------------------------------------------------------

@register_model("qknorm_transformer")
class QKTransformerModel(TransformerModel):
    """Transformer with PreNorm/PostNorm, LayerNorm/ScaleNorm/RMSNorm, FixNorm, SmallInit,
    QKNorm/Lp-QKNorm and DNAS/HNAS, each set by its own flag (see --help)."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        self.word_dropout = args.word_dropout
        self.unk = encoder.dictionary.unk()
        self.nspecial = encoder.dictionary.nspecial
        self.word_dropout_specials = args.word_dropout_specials
        self.pad = encoder.dictionary.pad()

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        config.add_args(parser)

    @classmethod
    def build_model(cls, args, task):
        config.fill(args, **config.DEFAULTS)  # also for checkpoints older than a flag
        uses_qknorm = check_args(args)
        distributed.check_ddp_backend(args)
        if uses_qknorm:  # the initial g, resolved once for every layer (and saved with the checkpoint)
            args.qknorm_g0 = distributed.same_on_all_ranks("QKNorm g0", resolve_qknorm_g0(args, task))
        model = super().build_model(args, task)
        if args.target_vocab_mask:
            allowed = target_vocab(task, args)
            distributed.same_on_all_ranks("the target vocabulary mask",
                                          hashlib.sha1(allowed.numpy().tobytes()).hexdigest())
            model.decoder.allowed_types.copy_(allowed)
            model.decoder.train_types = allowed
            # a checkpoint loaded into a training (resumed or fine-tuned) keeps these types allowed
            model.decoder.widen_loaded_mask = not _from_checkpoint(task)
        # the packed decoder's logits of the allowed types only, with targets as their columns, which
        # only this plugin's criterion reads (fairseq's would take column padding_idx for padding)
        model.decoder.allowed_only = bool(args.packed_decoder and args.target_vocab_mask
                                          and getattr(args, "criterion", None) == criterion.NAME)
        return model

    @classmethod
    def build_embedding(cls, args, dictionary, embed_dim, path=None):
        if getattr(args, "fixnorm", False):
            if path:
                raise ValueError("--fixnorm with pretrained embeddings (--*-embed-path) is not supported")
            return FixNormEmbedding(len(dictionary), embed_dim, dictionary.pad())
        return super().build_embedding(args, dictionary, embed_dim, path)

    @classmethod
    def build_encoder(cls, args, src_dict, embed_tokens):
        return QKEncoder(args, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, args, tgt_dict, embed_tokens):
        return QKDecoder(args, tgt_dict, embed_tokens, no_encoder_attn=args.no_cross_attention)

    def drop_words(self, tokens):
        """Word dropout (TwT Appendix A): replace non-special input tokens by <unk>; with
        --word-dropout-specials every non-pad token, EOS and BOS too (the original code's)."""
        drop = torch.rand(tokens.shape, device=tokens.device) < self.word_dropout
        droppable = tokens.ne(self.pad) if self.word_dropout_specials else tokens >= self.nspecial
        return tokens.masked_fill(drop & droppable, self.unk)

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        if self.training and self.word_dropout > 0:
            src_tokens, prev_output_tokens = self.drop_words(src_tokens), self.drop_words(prev_output_tokens)
        with shared_fixnorm(self.encoder.embed_tokens, self.decoder.embed_tokens):
            if not self.training or kwargs or not (self.encoder.packed or self.decoder.packed):
                return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)
            if self.encoder.packed:
                encoder_out = encoder_rows(self.encoder, src_tokens, grid=not self.decoder.packed)
            else:
                encoder_out = self.encoder(src_tokens, src_lengths=src_lengths)
            if self.decoder.packed:
                return decoder_rows(self.decoder, prev_output_tokens, encoder_out)
            return self.decoder(prev_output_tokens, encoder_out=encoder_out, src_lengths=src_lengths)

    def get_targets(self, sample, net_output):
        return packed_targets(super().get_targets(sample, net_output), net_output)
