"""`translation_qk`: fairseq's `translation` task plus the papers' decoding and ValDecay wiring.

GNMT length normalisation (`--length-norm gnmt --gnmt-alpha 0.6`): a finished hypothesis y
is ranked by  log P(y|x) / ((5 + |y|) / 6) ** alpha,  |y| counting the tokens fairseq scores,
EOS included. fairseq's own `--lenpen a` divides by |y| ** a instead.

Why re-ranking is enough: fairseq's beam search (sequence_generator.py, `finalize_hypos`)
moves a hypothesis ending in EOS into the finished list when EOS is among the top `beam`
candidates by *unnormalised* cumulative score, and a sentence is done once `beam` hypotheses
are finished (or at max length). The normalised score is computed only to be stored and to
sort the finished list at the end. So the stock generator run with `normalize_scores=False`
finds exactly the hypotheses any length normalisation would; `GNMTSequenceGenerator`
re-scores and re-sorts them. Used by `fairseq-generate --task translation_qk` and by
`--eval-bleu` validation during training.

`--beam-search twt` replaces that search by the original code's own (qknorm_fairseq/twt_search.py):
the GNMT score ranks the beam at every step and finished hypotheses keep their slots, so its
output can differ from fairseq's search + re-ranking.

ValDecay on every validation: fairseq calls the LR scheduler's `step(epoch, val)` only at the
end of a pass over the data. This task's `post_validate` hook (run by fairseq-train after every
validation, `--validate-interval-updates` ones included) hands the first validation subset's
`--best-checkpoint-metric` to the active `val_decay` scheduler. Reproduce the original code's
"epoch" of N updates with `--validate-interval-updates N --save-interval-updates N`.

The task's dictionaries turn token tensors into text from a list (qknorm_fairseq/dictionary.py):
the same strings, without fairseq's ATen ops per token, in every validation and fairseq-generate.

A validation batch's encoder runs once (`encoder_once`): fairseq's valid_step computes the loss, whose
forward encodes the batch, and then `--eval-bleu`'s search encodes the same source again; the search now
gets the loss's encoder output (the same numbers) unless `--decode-precision` decodes in another precision.
"""
import contextlib
import functools
import logging
from dataclasses import dataclass, field
from unittest import mock

import sacrebleu
import torch
from fairseq.dataclass import ChoiceEnum
from fairseq.models.transformer import TransformerEncoderBase
from fairseq.sequence_generator import EnsembleModel, SequenceGenerator
from fairseq.tasks import register_task
from fairseq.tasks.translation import TranslationConfig, TranslationTask
from omegaconf import II

from . import lr_scheduler as val_decay_module
from .compile import compile_layers
from .decoder_cache import CachedEnsemble, unsupported
from .dictionary import ListStringDictionary
from .length_buckets import LengthBucketDataset
from .length_groups import merged_logs, split_by_target_length
from .twt_search import TwTSequenceGenerator, gnmt_penalty

logger = logging.getLogger(__name__)

BEAM_SEARCHES = ("fairseq", "twt")

LENGTH_NORMS = ("fairseq", "gnmt")

DECODER_STEPS = ("cached", "fairseq")


def precision_problem(precision, device):
    """Why decoding under autocast in `precision` cannot run on `device` ("cuda" or "cpu"); None if it can."""
    if precision == "fp32" or device == "cuda" or (precision == "bf16" and torch.ops.mkldnn._is_mkldnn_bf16_supported()):
        return None
    return (f"--decode-precision {precision} needs a CUDA device{'' if precision == 'fp16' else ' or a CPU with bf16 kernels'}; "
            "decode in fp32 (drop the flag)")


@contextlib.contextmanager
def encoder_once(model, net_input):
    """Within the block, MODEL's encoder computes NET_INPUT's source once: a later call on the same tensors
    (fairseq's search after the loss's forward, both in evaluation mode without gradients) gets a copy of the
    first call's output dict, the same tensors, less the layers' states where it does not ask for them (the
    loss's forward asks, fairseq's default). Other encoders than fairseq's Transformer's run as they are."""
    encoder = getattr(model, "encoder", None)
    if not isinstance(encoder, TransformerEncoderBase):
        yield
        return
    forward, first = encoder.forward, {}

    def once(src_tokens, src_lengths=None, return_all_hiddens=False, **kwargs):
        if src_tokens is not net_input["src_tokens"] or src_lengths is not net_input.get("src_lengths") or \
                any(v is not None for v in kwargs.values()) or torch.is_grad_enabled():
            return forward(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens, **kwargs)
        if "out" not in first or return_all_hiddens and not first["states"]:
            first.update(out=forward(src_tokens, src_lengths=src_lengths, return_all_hiddens=return_all_hiddens),
                         states=return_all_hiddens)
        out = dict(first["out"])
        if first["states"] and not return_all_hiddens:
            out.update(encoder_states=[], fc_results=[])
        return out

    with mock.patch.object(encoder, "forward", once):
        yield


# fairseq's generation flags, as {flag: (attribute, default)}: those the original code's search does not read,
# and those that contradict GNMT's length normalisation
TWT_UNREAD = {"--min-len": ("min_len", 1), "--unkpen": ("unkpen", 0), "--no-repeat-ngram-size": ("no_repeat_ngram_size", 0),
              "--diverse-beam-groups": ("diverse_beam_groups", -1), "--match-source-len": ("match_source_len", False)}
GNMT_CLASHES = {"--lenpen": ("lenpen", 1), "--unnormalized": ("unnormalized", False),
                "--print-alignment": ("print_alignment", None), "--sampling": ("sampling", False)}


def _should_stop_early():
    from fairseq_cli import train  # fairseq-train's own module: its early stop keeps its count on this function

    return train.should_stop_early


def _given(args, flags):
    """The FLAGS that ARGS sets to something other than their default."""
    return [f for f, (attr, default) in flags.items()
            if (value := getattr(args, attr, default)) is not None and value is not False and value != default]


def _refuse(what, flags, instead):
    if flags:
        raise ValueError(f"{what} {', '.join(flags)}: drop {' and '.join(flags)}, or use {instead}")


def gnmt_rerank(hypos, alpha):
    """Re-score one sentence's finished hypotheses (unnormalised scores) and sort them, best first."""
    for h in hypos:
        h["score"] = h["score"] / gnmt_penalty(len(h["tokens"]), alpha)
    return sorted(hypos, key=lambda h: float(h["score"]), reverse=True)


class GNMTSequenceGenerator(SequenceGenerator):
    """fairseq's beam search with GNMT length normalisation applied to the finished hypotheses."""

    def __init__(self, *args, gnmt_alpha=0.6, **kwargs):
        kwargs["normalize_scores"] = False  # raw log-probabilities; normalised below
        super().__init__(*args, **kwargs)
        self.gnmt_alpha = gnmt_alpha

    @torch.no_grad()
    def _generate(self, sample, **kwargs):
        finalized = super()._generate(sample, **kwargs)
        return [gnmt_rerank(hypos, self.gnmt_alpha) for hypos in finalized]


@dataclass
class TranslationQKConfig(TranslationConfig):
    length_norm: ChoiceEnum(LENGTH_NORMS) = field(
        default="fairseq",
        metadata={"help": "hypothesis length normalisation: fairseq (score / |y|^lenpen) or "
                          "gnmt (score / ((5+|y|)/6)^gnmt_alpha)"},
    )
    gnmt_alpha: float = field(default=0.6, metadata={"help": "alpha of GNMT length normalisation"})
    beam_search: ChoiceEnum(BEAM_SEARCHES) = field(
        default="fairseq",
        metadata={"help": "fairseq: fairseq's search (GNMT re-ranks its finished hypotheses); twt: the original "
                          "TwT/QKNorm code's search (GNMT score inside the beam, finished hypotheses keep "
                          "their slot; needs --length-norm gnmt)"},
    )
    decode_precision: ChoiceEnum(("fp32", "bf16", "fp16")) = field(
        default="fp32",
        metadata={"help": "decode under autocast in this precision, on a GPU or (bf16) a CPU with bf16 support "
                          "(fairseq-generate has no --bf16; a model trained with --bf16/--fp16 already validates "
                          "in its own precision)"},
    )
    length_buckets: int = field(
        default=0,
        metadata={"help": "batch the training split in N length buckets, each padded to one shape (at most N + 1 "
                          "batch shapes an epoch; qknorm_fairseq/length_buckets.py); 0: fairseq's batching"},
    )
    length_groups: int = field(
        default=1,
        metadata={"help": "compute each training batch as N groups of sentences sorted by target length, each "
                          "trimmed to its own longest sentence, their gradients added up: the same update up to "
                          "rounding, with less padding computed (qknorm_fairseq/length_groups.py); 1: the batch whole"},
    )
    decoder_step: ChoiceEnum(DECODER_STEPS) = field(
        default="cached",
        metadata={"help": "beam search's decoder step for qknorm_transformer models: cached (a preallocated key/value "
                          "cache written in place, the source's keys and values computed once per batch; "
                          "qknorm_fairseq/decoder_cache.py) or fairseq (fairseq's incremental state); the same "
                          "log-probabilities. Other models, and --print-alignment, take fairseq's"},
    )
    compile: bool = field(
        default=False,
        metadata={"help": "train with each encoder and decoder layer compiled by torch.compile (validation and "
                          "decoding stay eager; qknorm_fairseq/compile.py)"},
    )
    cpu: bool = II("common.cpu")


@register_task("translation_qk", dataclass=TranslationQKConfig)
class TranslationQKTask(TranslationTask):
    cfg: TranslationQKConfig

    @classmethod
    def load_dictionary(cls, filename):
        return ListStringDictionary.load(filename)

    @classmethod
    def setup_task(cls, cfg, **kwargs):
        # Refuse a decoding precision this machine lacks before fairseq loads a model; inference_step
        # checks the device the model actually landed on.
        device = "cpu" if getattr(cfg, "cpu", False) or not torch.cuda.is_available() else "cuda"
        problem = precision_problem(cfg.decode_precision, device)
        if problem:
            raise ValueError(problem)
        if cfg.length_groups < 1:
            raise ValueError(f"--length-groups {cfg.length_groups} must be >= 1 (1: each batch whole)")
        return super().setup_task(cfg, **kwargs)

    def build_generator(self, models, args, seq_gen_cls=None, extra_gen_cls_kwargs=None, **kwargs):
        if self.cfg.beam_search == "twt" and self.cfg.length_norm != "gnmt":
            raise ValueError("--beam-search twt ranks the beam by GNMT's normalised score: add --length-norm gnmt")
        if self.cfg.length_norm == "gnmt" and not getattr(args, "score_reference", False):  # twt needs gnmt (above)
            _refuse("--length-norm gnmt does not combine with", _given(args, GNMT_CLASHES), "--length-norm fairseq")
            if self.cfg.beam_search == "twt":
                _refuse("--beam-search twt (the original code's search) has no", _given(args, TWT_UNREAD),
                        "--beam-search fairseq")
            if seq_gen_cls is not None:
                raise ValueError(f"--length-norm gnmt cannot wrap the custom generator {seq_gen_cls.__name__}")
            seq_gen_cls = TwTSequenceGenerator if self.cfg.beam_search == "twt" else GNMTSequenceGenerator
            extra_gen_cls_kwargs = dict(extra_gen_cls_kwargs or {}, gnmt_alpha=self.cfg.gnmt_alpha)
        return super().build_generator(self.decoding_models(models, args), args, seq_gen_cls=seq_gen_cls,
                                       extra_gen_cls_kwargs=extra_gen_cls_kwargs, **kwargs)

    def decoding_models(self, models, args):
        """MODELS as the generator decodes them: with --decoder-step cached, a CachedEnsemble where
        every model is a qknorm_transformer (fairseq's search and TwT's both take it)."""
        if self.cfg.decoder_step != "cached" or isinstance(models, EnsembleModel) or \
                getattr(args, "score_reference", False):
            return models
        why = "--print-alignment reads fairseq's attention weights" if getattr(args, "print_alignment", False) \
            else next(filter(None, map(unsupported, models)), None)
        if why:
            logger.info(f"decoder step: fairseq's ({why})")
            return models
        return CachedEnsemble(models)

    def build_model(self, cfg, from_checkpoint=False):
        # the model reads its training data (QKNorm's g0, the vocabulary mask) unless a checkpoint is loaded into it
        self.building_from_checkpoint = from_checkpoint
        model = super().build_model(cfg, from_checkpoint)
        if self.cfg.compile:
            if getattr(getattr(model, "decoder", None), "fused_kernels", False):
                raise ValueError("--compile compiles each layer whole, --fused-kernels parts of them: "
                                 "drop one of them")
            for part in ("encoder", "decoder"):
                if getattr(getattr(model, part, None), "packed", False):
                    raise ValueError(f"--compile compiles each layer's forward, which --packed-{part}'s training "
                                     "forward does not call: drop one of them")
            logger.info(f"--compile: {compile_layers(model)} layers compiled for training")
        return model

    def load_dataset(self, split, epoch=1, combine=False, **kwargs):
        super().load_dataset(split, epoch, combine, **kwargs)
        if self.cfg.length_buckets < 0:
            raise ValueError(f"--length-buckets {self.cfg.length_buckets} must be >= 0 (0: fairseq's batching)")
        if self.cfg.length_buckets and split.startswith("train"):
            self.datasets[split] = LengthBucketDataset(self.datasets[split], self.cfg.length_buckets)
            logger.info(f"{split}: {self.cfg.length_buckets} length buckets, padded to "
                        f"{', '.join(map(str, self.datasets[split].bounds))} tokens")

    def train_step(self, sample, model, criterion, optimizer, update_num, ignore_grad=False):
        if self.cfg.length_groups == 1:
            return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        total, size, logs = 0.0, 0, []
        for group in split_by_target_length(sample, self.cfg.length_groups, self.tgt_dict.pad()):
            # fairseq's train_step on each group: its backward adds the group's gradient to the others'
            loss, group_size, log = super().train_step(group, model, criterion, optimizer, update_num, ignore_grad)
            total, size = total + loss.detach(), size + group_size
            logs.append(log)
        return total, size, merged_logs(logs)

    def valid_step(self, sample, model, criterion):
        if self.cfg.decode_precision != "fp32":  # the search encodes under autocast: other numbers than the loss's
            return super().valid_step(sample, model, criterion)
        with encoder_once(getattr(model, "module", model), sample["net_input"]):
            return super().valid_step(sample, model, criterion)

    def inference_step(self, generator, models, sample, prefix_tokens=None, constraints=None):
        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.cfg.decode_precision)
        if dtype is None:
            return super().inference_step(generator, models, sample, prefix_tokens, constraints)
        device = next(models[0].parameters()).device.type
        problem = precision_problem(self.cfg.decode_precision, device)
        if problem:
            raise ValueError(problem)
        with torch.autocast(device, dtype=dtype):
            return super().inference_step(generator, models, sample, prefix_tokens, constraints)

    def _inference_with_bleu(self, generator, sample, model):
        # fairseq strips and copies each reference to the host on its own, two syncs a sentence on a
        # GPU; one copy of the batch's targets serves them all (twt_search's hypotheses are on the host).
        sample = {**sample, "target": sample["target"].cpu()}
        if not self.cfg.eval_tokenized_bleu:
            return super()._inference_with_bleu(generator, sample, model)
        # --eval-tokenized-bleu scores tokenized text on purpose: sacrebleu's `force` stops its warning
        # about a batch of 100 or more hypotheses ending in " ." (same score), printed every validation.
        with mock.patch.object(sacrebleu, "corpus_bleu", functools.partial(sacrebleu.corpus_bleu, force=True)):
            return super()._inference_with_bleu(generator, sample, model)

    # fairseq-train counts --patience on its should_stop_early function, which a resume starts afresh (a
    # resumed run would train longer than one that was never stopped); fairseq saves a task's dict with the
    # checkpoint and hands it back on a resume (not when fine-tuning, which resets the data loader)
    def get_checkpoint_dict(self):
        stop = _should_stop_early()
        if getattr(stop, "best", None) is None:
            return {}
        return {type(self).__name__: {"patience": {"best": float(stop.best), "num_runs": int(stop.num_runs)}}}

    def set_checkpoint_dict(self, state):
        if "patience" in state:
            stop = _should_stop_early()
            stop.best, stop.num_runs = state["patience"]["best"], state["patience"]["num_runs"]
            logger.info(f"--patience: {stop.num_runs} validations since the best one ({stop.best}), from the checkpoint")

    def begin_valid_epoch(self, epoch, model):
        super().begin_valid_epoch(epoch, model)
        self._fed_this_validation = False

    def post_validate(self, model, stats, agg):
        # fairseq-train calls this once per validation subset; ValDecay, like fairseq's own
        # lr_step, follows the first subset only.
        if getattr(self, "_fed_this_validation", True):
            return
        self._fed_this_validation = True
        sched = val_decay_module.active_scheduler()
        if sched is None:
            return
        metric = sched.cfg.best_checkpoint_metric
        if metric not in stats:
            raise KeyError(f"val_decay follows --best-checkpoint-metric {metric!r}, but validation reported only "
                           f"{sorted(stats)}; add --eval-bleu for bleu, or pick one of these")
        sched.on_validation(stats[metric], stats["num_updates"])
