"""Training recipes: configs/base.yaml merged with configs/<pair>.yaml (only what differs), read
through the structured config Recipe below, so that a misspelt key, a wrong type or a value out of
range (ranged) is a one-line RecipeError naming the file's key.

A prepared pair with no file of its own (bash scripts/prepare.sh --pair xx-yy --src-dir DIR) gets
the base recipe with model size and epoch length from its training-set size (size_from_data).

    python -m qknorm_pipeline.recipes get PAIR KEY      # KEY is dotted, e.g. data.bpe_merges
    python -m qknorm_pipeline.recipes train-args PAIR SYSTEM [--schedule S] [--stopping F]
        [--paper-qknorm-length] [--data-bin DIR] [--save-dir DIR]  # fairseq-train arguments, one quoted line
    python -m qknorm_pipeline.recipes generate-args PAIR [--data-bin DIR]  # fairseq-generate decoding arguments
    python -m qknorm_pipeline.recipes systems PAIR        # the systems a config defines
    python -m qknorm_pipeline.recipes schedules PAIR      # its learning-rate schedules (TwT Table 4)
PAIR's prepared data is looked up in --data-bin, else $DATA_BIN/PAIR (default data-bin/PAIR).

Every fairseq-train command line is built here: ours (train_args) and stock fairseq's (stock_args).
"""
import dataclasses
import enum
import json
import operator
import os
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from .cli import Parser, UsageError
from .cli import main as run_main
from .files import read_json
from .names import folder_name
from .paths import CONFIG_DIR, USER_DIR, folders, redo, shareable, short

BASE = "base"
PRECISIONS = ("fp32", "bf16", "fp16")  # train.sh --precision; the plugin's --decode-precision has the same
STOCK_ARCH = "transformer"             # stock fairseq's own architecture (plain fairseq-train, no --user-dir)
STOCK = "fairseq_transformer"          # the name of its runs in the benchmarks and the studies
# fairseq's --remove-bpe / --eval-bleu-remove-bpe value that undoes each segmentation
REMOVE_BPE = {"fastbpe": "@@ ", "sentencepiece": "sentencepiece"}


class RecipeError(UsageError):
    """A recipe that cannot be built: an unknown pair, system or key, a wrong value."""


def ranged(default, at_least=None, above=None, below=None, divides=None):
    """A config field whose value check_ranges keeps AT_LEAST <= v, ABOVE < v, v < BELOW, and that
    divides the sibling field DIVIDES (heads divide embed_dim)."""
    limits = {"at_least": at_least, "above": above, "below": below, "divides": divides}
    return field(default=default, metadata={k: v for k, v in limits.items() if v is not None})


LIMITS = {"at_least": (">=", operator.ge), "above": (">", operator.gt), "below": ("<", operator.lt)}


def check_ranges(obj, what, path=""):
    """A RecipeError naming the first field of OBJ (a config's dataclasses, dicts of them) whose
    value is outside its ranged() limits."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            check_ranges(v, what, f"{path}{k}.")
    if not dataclasses.is_dataclass(obj):
        return
    for f in dataclasses.fields(obj):
        v, m = getattr(obj, f.name), f.metadata
        if isinstance(v, (int, float)) and not isinstance(v, bool) and m:
            rules = [(f"{sign} {m[k]:g}", test(v, m[k])) for k, (sign, test) in LIMITS.items() if k in m]
            if not all(ok for _, ok in rules):
                raise RecipeError(f"{what}: {path}{f.name} is {v:g}; it must be {' and '.join(r for r, _ in rules)}")
            if "divides" in m and getattr(obj, m["divides"]) % v:
                raise RecipeError(f"{what}: {path}{f.name} ({v}) must divide {path}{m['divides']} "
                                  f"({getattr(obj, m['divides'])}): each head gets an equal share of it")
        check_ranges(v, what, f"{path}{f.name}.")


class Bpe(enum.Enum):
    fastbpe = "fastbpe"
    sentencepiece = "sentencepiece"


class Scheduler(enum.Enum):
    val_decay = "val_decay"
    inverse_sqrt = "inverse_sqrt"


class LengthNorm(enum.Enum):  # the plugin's --length-norm
    fairseq = "fairseq"
    gnmt = "gnmt"


class BeamSearch(enum.Enum):  # the plugin's --beam-search
    fairseq = "fairseq"
    twt = "twt"


class Positions(enum.Enum):  # the plugin's --positions
    fairseq = "fairseq"
    twt = "twt"
    qknorm = "qknorm"


@dataclass
class Data:
    source: Optional[str] = None            # where download.sh fetches it (data/sources.py)
    tokenized: bool = True                  # arrives Moses-tokenized
    max_len: int = ranged(250, at_least=1)  # train length filter before BPE, in tokens
    bpe: Bpe = Bpe.fastbpe
    bpe_merges: int = ranged(8000, at_least=1)
    expected_lines: Dict[str, Optional[int]] = field(default_factory=dict)
    exact_sources: List[str] = field(default_factory=list)


@dataclass
class Eval:
    metric: str = "multi_bleu_detok"
    detok: str = "moses"


@dataclass
class Model:
    embed_dim: int = ranged(512, at_least=1)
    ffn_dim: int = ranged(2048, at_least=1)
    encoder_layers: int = ranged(6, at_least=1)
    decoder_layers: int = ranged(6, at_least=1)
    heads: int = ranged(8, at_least=1, divides="embed_dim")
    dropout: float = ranged(0.3, at_least=0, below=1)  # on sublayer outputs, attention weights and ReLU alike
    qknorm_length: Optional[float] = ranged(None, above=0)  # the papers' L, used with --paper-qknorm-length


@dataclass
class Train:
    criterion: str = "masked_label_smoothed_cross_entropy"
    label_smoothing: float = ranged(0.1, at_least=0, below=1)
    max_tokens: int = ranged(4096, at_least=1)
    optimizer: str = "multi_tensor_adam"    # or adam: fairseq's, the same update
    adam_betas: str = "(0.9, 0.999)"
    adam_eps: float = ranged(1e-8, above=0)
    weight_decay: float = ranged(0.0, at_least=0)
    clip_norm: float = ranged(1.0, at_least=0)   # 0: no clipping
    epoch_updates: int = ranged(2000, at_least=1)
    max_epochs: int = ranged(200, at_least=1)
    log_interval: int = ranged(100, at_least=1)
    seed: int = ranged(1, at_least=0)
    schedule: str = "valdecay"              # the entry of schedules: used unless --schedule names another


@dataclass
class Schedule:
    scheduler: Scheduler = Scheduler.val_decay
    warmup_updates: int = ranged(0, at_least=0)
    lr: Optional[float] = ranged(None, above=0)        # the peak, or ...
    lr_scale: Optional[float] = ranged(None, above=0)  # ... TwT's rule lr_scale * d^-0.5 * warmup^-0.5
    decay_factor: Optional[float] = ranged(None, above=0, below=1)  # val_decay only
    decay_patience: Optional[int] = ranged(None, at_least=0)        # val_decay only


@dataclass
class Stopping:
    stop_lr: float = -1.0                   # stop once the LR falls below (val_decay's --decay-stop-lr)
    patience: int = -1                      # stop after this many validations without dev BLEU gain; -1: never
    schedule: Optional[str] = None          # the rule's own schedule (a procedure one flag away)


@dataclass
class Decode:
    beam: int = ranged(4, at_least=1)
    length_norm: LengthNorm = LengthNorm.gnmt
    gnmt_alpha: float = ranged(0.6, at_least=0)
    max_len_a: float = ranged(1, at_least=0)
    max_len_b: int = ranged(50, at_least=0)
    beam_search: BeamSearch = BeamSearch.twt


@dataclass
class System:
    arch: str = "???"
    stopping: str = "???"
    positions: Optional[Positions] = None   # --positions; None: the preset's


@dataclass
class Stock:
    """Stock fairseq's recipe: plain fairseq-train of STOCK_ARCH, the reference row of studies and benchmarks."""

    flags: Dict[str, Any] = field(default_factory=dict)  # every stock run
    iwslt: Dict[str, Any] = field(default_factory=dict)  # fairseq's IWSLT recipe
    warmup_updates: int = ranged(4000, at_least=0)  # the IWSLT recipe's; a study sets its own


@dataclass
class Cpu:
    # A CPU run's numbers depend on the thread count and the instruction set the kernels use
    # (docs/reproducibility.md). Set both to get the same numbers on every AVX2 CPU of one vendor
    # (MKL's code path differs between Intel's and AMD's).
    threads: Optional[int] = ranged(None, at_least=1)  # OMP_NUM_THREADS and MKL_NUM_THREADS
    isa: Optional[str] = None               # e.g. avx2: ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA
    fast: Dict[str, Any] = field(default_factory=dict)       # train.sh --fast: fairseq flags
    fast_bf16: Dict[str, Any] = field(default_factory=dict)  # train.sh --fast in bf16: these too


@dataclass
class Gpu:
    # Beam search on a GPU is host-bound, about a fixed cost per decoder call, so validation's fewer,
    # larger batches take less time; a CPU pays for their padding instead (docs/gpu.md, "Measuring validation").
    max_tokens_valid: Optional[int] = ranged(None, at_least=1)  # fairseq's --max-tokens-valid on a GPU; None: --max-tokens


@dataclass
class Recipe:
    pair: str = ""
    src: str = ""
    tgt: str = ""
    size_from_data: bool = False            # a pair's file that only overrides the sized base recipe
    data: Data = field(default_factory=Data)
    eval: Eval = field(default_factory=Eval)
    model: Model = field(default_factory=Model)
    train: Train = field(default_factory=Train)
    schedules: Dict[str, Schedule] = field(default_factory=dict)
    stopping: Dict[str, Stopping] = field(default_factory=dict)
    decode: Decode = field(default_factory=Decode)
    systems: Dict[str, System] = field(default_factory=dict)
    cpu: Cpu = field(default_factory=Cpu)
    gpu: Gpu = field(default_factory=Gpu)
    stock: Stock = field(default_factory=Stock)


# size_from_data: the papers' pairs are the reference points (TwT Table 1). gl->en (10k training
# pairs) has 4+4 layers, 4 heads, dropout 0.4, 100 updates per epoch, 1000 epochs; sk->en (61k),
# en->vi (133k), ar->en and en->he (214k) have the base model (6+6 layers, 8 heads, dropout 0.3),
# 600 / 1500 / 2000 updates per epoch and 200 epochs. Updates per epoch are ~1 per 100 training
# pairs in all five (100 / 615 / 1333 / 2140 by that rule); below the geometric mean of 10k and
# 61k pairs a corpus gets gl->en's smaller model.
SMALL_CORPUS = 25_000
SMALL_MODEL = {"model": {"encoder_layers": 4, "decoder_layers": 4, "heads": 4, "dropout": 0.4},
               "train": {"max_epochs": 1000}, "stopping": {"twt_paper": {"patience": 50}}}


def size_from_data(n_train):
    """Recipe overrides for a corpus of N_TRAIN training pairs (see SMALL_CORPUS)."""
    small = n_train < SMALL_CORPUS
    over = {"model": dict(SMALL_MODEL["model"]), "train": dict(SMALL_MODEL["train"]),
            "stopping": SMALL_MODEL["stopping"]} if small else {"model": {}, "train": {}}
    over["train"]["epoch_updates"] = max(10, round(n_train / 100))
    return over


def available_pairs():
    return sorted(f[: -len(".yaml")] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml") and f != f"{BASE}.yaml")


def default_data_bin(pair):
    return os.path.join(folders().data_bin, pair)


def read_stats(data_bin):
    """DATA_BIN/stats.json (prepare.sh's, data/stats.py) as a dict, or None when the pair is not prepared."""
    path = os.path.join(data_bin, "stats.json")
    if not os.path.exists(path):
        return None
    return read_json(path, redo(data_bin, os.path.basename(os.path.normpath(data_bin))))


def read_yaml(path, error=None):
    """The mapping a config file holds ({} when empty), or ERROR (a RecipeError by default) naming
    the file and what is wrong with it."""
    import yaml

    error = error or RecipeError
    if not os.path.isfile(path):
        raise error(f"{shareable(path)}: no such config file")
    with open(path, encoding="utf-8") as f:
        try:
            layer = yaml.safe_load(f)
        except yaml.YAMLError as e:
            where = getattr(e, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where else ""
            raise error(f"{shareable(path)}: not valid YAML ({getattr(e, 'problem', None) or e}{at}): fix the "
                        "file") from None
    if layer is not None and not isinstance(layer, dict):
        kind = {list: "a list", str: "a string", bool: "true/false"}.get(type(layer), "a number")
        raise error(f"{shareable(path)}: a config holds keys (key: value), not {kind}")
    return layer or {}


def structured(schema, layers, what):
    """LAYERS (dicts) merged onto the dataclass SCHEMA with OmegaConf and checked against it: the
    typed object, or a RecipeError naming the key that is unknown, missing, of the wrong type or out
    of range."""
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), *layers))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        msg = str(e).splitlines()[0]
        raise RecipeError(f"{what}: {key + ': ' if key else ''}{msg}") from None
    check_ranges(merged, what)
    return merged


def base():
    """configs/base.yaml alone: what a pair without a config of its own starts from."""
    return structured(Recipe, [read_yaml(os.path.join(CONFIG_DIR, f"{BASE}.yaml"))], f"configs/{BASE}.yaml")


def load(pair, data_bin=None, announce=False):
    """The merged recipe of PAIR (a Recipe). ANNOUNCE: print the sizes chosen from the data, if any."""
    if pair == BASE:
        raise RecipeError(f"{BASE!r} is the recipe every pair starts from, not a pair: name a pair")
    folder_name("pair", pair, RecipeError)
    path = os.path.join(CONFIG_DIR, f"{pair}.yaml")
    own = read_yaml(path) if os.path.exists(path) else None
    layers = [read_yaml(os.path.join(CONFIG_DIR, f"{BASE}.yaml"))]
    if own is None or own.get("size_from_data"):
        data_bin = data_bin or default_data_bin(pair)
        stats = read_stats(data_bin)
        if stats is None:
            raise RecipeError(f"unknown pair {pair!r}: no {short(path)} and no prepared data in {short(data_bin)}. Known pairs: "
                              f"{', '.join(available_pairs())}; for your own corpus run first: "
                              f"bash scripts/prepare.sh --pair {pair} --src-dir DIR")
        n_train = stats["lines"]["train"]["kept"]
        sized = size_from_data(n_train)
        layers += [{"src": stats["src"], "tgt": stats["tgt"]}, sized]
        if announce:
            print(f"[recipes] {pair}: no recipe of its own, so the base recipe sized for {n_train} training "
                  f"pairs: {_describe(sized)} (size_from_data in qknorm_pipeline/recipes.py). To change it, write "
                  f"{path} with 'size_from_data: true' and the keys to override, or pass fairseq flags "
                  "after PAIR SYSTEM to train.sh", file=sys.stderr)
    layers += [own or {}, {"pair": pair}]
    cfg = structured(Recipe, layers, f"configs/{pair}.yaml over configs/{BASE}.yaml")
    if not (cfg.src and cfg.tgt):
        raise RecipeError(f"{short(path)}: src and tgt (the language codes of its files) are required, or "
                          "'size_from_data: true' to take them from the prepared data")
    return cfg


def _describe(over):
    flat = [f"{k}={v}" for sec in ("model", "train") for k, v in over[sec].items()]
    flat += [f"stopping.{k}.{a}={b}" for k, d in over.get("stopping", {}).items() for a, b in d.items()]
    return ", ".join(flat)


def remove_bpe(cfg, data_bin=None):
    """fairseq's --remove-bpe value for the pair: from the segmentation prepare.sh recorded in
    DATA_BIN/stats.json, or from the recipe's data.bpe while the pair is not prepared yet."""
    stats = read_stats(data_bin or default_data_bin(cfg.pair))
    bpe = stats["bpe"] if stats else cfg.data.bpe.value
    if bpe not in REMOVE_BPE:
        raise RecipeError(f"segmentation {bpe!r} of {cfg.pair} is unknown: it must be one of {', '.join(REMOVE_BPE)}")
    return REMOVE_BPE[bpe]


def get(cfg, key):
    """The value at the dotted KEY (a RecipeError names a missing one)."""
    node = cfg
    for part in key.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif dataclasses.is_dataclass(node) and part in {f.name for f in dataclasses.fields(node)}:
            node = getattr(node, part)
        else:
            raise RecipeError(f"config for {getattr(cfg, 'pair', None)!r} has no key {key!r}")
    return node.value if isinstance(node, enum.Enum) else node


def peak_lr(scale, dim, warmup):
    """TwT's peak LR: scale * d^-0.5 * warmup^-0.5 (Eq. 7 at n = warmup; 4.94e-4 for scale 1,
    d = 512, warmup 8000)."""
    return scale * dim**-0.5 * warmup**-0.5


def stopping(cfg, name):
    """The entry NAME of the config's stopping: rules."""
    if name not in cfg.stopping:
        raise RecipeError(f"config {cfg.pair!r} has no stopping rule {name!r}; known: {', '.join(cfg.stopping)}")
    return cfg.stopping[name]


def schedule(cfg, name):
    """(name, Schedule) of the schedule NAME, or of the recipe's default when NAME is None."""
    name = name or cfg.train.schedule
    if name not in cfg.schedules:
        raise RecipeError(f"config {cfg.pair!r} has no schedule {name!r}; known: {', '.join(cfg.schedules)}")
    return name, cfg.schedules[name]


def schedule_peak(cfg, s, dim=None):
    """The peak LR of schedule S at the recipe's model size, or at model size DIM."""
    if s.lr_scale is not None:  # TwT: lambda * d^-0.5 * warmup^-0.5
        return peak_lr(s.lr_scale, dim or cfg.model.embed_dim, s.warmup_updates)
    if s.lr is None:
        raise RecipeError(f"a schedule of {cfg.pair!r} gives neither lr nor lr_scale")
    return s.lr


def schedule_args(cfg, name, stop_lr):
    """fairseq-train flags of one learning-rate schedule of the config's schedules: section."""
    name, s = schedule(cfg, name)
    args = ["--lr-scheduler", s.scheduler.value, "--lr", f"{schedule_peak(cfg, s):.6g}",
            "--warmup-updates", str(s.warmup_updates)]
    if s.scheduler is Scheduler.val_decay:
        if s.decay_factor is None or s.decay_patience is None:
            raise RecipeError(f"schedules.{name} of {cfg.pair}: val_decay needs decay_factor and decay_patience")
        args += ["--decay-factor", str(s.decay_factor), "--decay-patience", str(s.decay_patience),
                 "--decay-stop-lr", f"{stop_lr:g}"]
    else:
        args += ["--warmup-init-lr", "0"]
    return args


def system(cfg, name):
    if name not in cfg.systems:
        raise RecipeError(f"config {cfg.pair!r} has no system {name!r}; known: {', '.join(cfg.systems)}")
    return cfg.systems[name]


def flag(key, value):
    """fairseq's spelling of one flag: --key value, --key for True, --no-key for False."""
    name = "--" + key.replace("_", "-")
    if value is True:
        return [name]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    return [name, str(value)]


def flag_args(flags):
    """The fairseq flags of a {key: value} dict, in its order."""
    return [a for key, value in flags.items() for a in flag(key, value)]


def size_args(embed_dim, ffn_dim, encoder_layers, decoder_layers, heads):
    """fairseq-train's model-size flags, the same for every architecture, ours and stock."""
    d, ffn, enc, dec, h = (str(x) for x in (embed_dim, ffn_dim, encoder_layers, decoder_layers, heads))
    return ["--encoder-embed-dim", d, "--decoder-embed-dim", d, "--encoder-ffn-embed-dim", ffn,
            "--decoder-ffn-embed-dim", ffn, "--encoder-layers", enc, "--decoder-layers", dec,
            "--encoder-attention-heads", h, "--decoder-attention-heads", h]


def train_args(cfg, system_name, schedule_name=None, paper_qknorm_length=False, data_bin=None, save_dir=None,
               stopping_rule=None):
    """The fairseq-train argument list for PAIR and SYSTEM (everything but extra user flags)."""
    s = system(cfg, system_name)
    model, train, decode = cfg.model, cfg.train, cfg.decode
    args = [data_bin or os.path.join("data-bin", cfg.pair), "--user-dir", USER_DIR, "--task", "translation_qk",
            "--source-lang", cfg.src, "--target-lang", cfg.tgt, "--arch", s.arch]
    args += size_args(model.embed_dim, model.ffn_dim, model.encoder_layers, model.decoder_layers, model.heads)
    args += ["--dropout", str(model.dropout), "--attention-dropout", str(model.dropout),
             "--activation-dropout", str(model.dropout)]
    args += ["--positions", s.positions.value] if s.positions else []
    if paper_qknorm_length:
        if model.qknorm_length is None:
            raise RecipeError(f"config {cfg.pair!r} has no model.qknorm_length (the papers give none for it): "
                              "drop --paper-qknorm-length to compute L from the training data")
        args += ["--qknorm-length", f"{model.qknorm_length:g}"]
    args += ["--criterion", train.criterion, "--label-smoothing", str(train.label_smoothing),
             "--optimizer", train.optimizer, "--adam-betas", train.adam_betas, "--adam-eps", str(train.adam_eps),
             "--weight-decay", str(train.weight_decay), "--clip-norm", str(train.clip_norm),
             "--max-tokens", str(train.max_tokens), "--seed", str(train.seed)]
    rule = stopping(cfg, stopping_rule or s.stopping)
    args += schedule_args(cfg, schedule_name or rule.schedule, rule.stop_lr)
    # the original code's "epoch": validate, decay and save every `epoch` updates (task.py)
    epoch = train.epoch_updates
    args += ["--validate-interval-updates", str(epoch), "--save-interval-updates", str(epoch), *KEEP_LAST,
             "--max-update", str(epoch * train.max_epochs), "--patience", str(rule.patience)]
    gen = {"beam": decode.beam, "max_len_a": _number(decode.max_len_a), "max_len_b": decode.max_len_b}
    args += [*dev_bleu_args(remove_bpe(cfg, data_bin), gen), *decode_args(decode), *log_args(train.log_interval)]
    if save_dir:
        args += ["--save-dir", save_dir]
    return args


def stock_args(cfg, flags, data_bin, save_dir, seed, extra=()):
    """fairseq-train's arguments for stock fairseq's STOCK_ARCH (no --user-dir) on CFG's pair: FLAGS
    (cfg.stock's, as the caller merged them), EXTRA (model size, budget, precision), then the seed and
    the dev BLEU, checkpoint and log settings of ours."""
    return [data_bin, "--source-lang", cfg.src, "--target-lang", cfg.tgt, *flag_args({"arch": STOCK_ARCH, **flags}),
            *extra, "--seed", str(seed), *KEEP_LAST, *dev_bleu_args(remove_bpe(cfg, data_bin)),
            *log_args(cfg.train.log_interval), "--save-dir", save_dir]


# validation and checkpoints come every --validate-interval-updates; only the last and the best are kept
KEEP_LAST = ["--validate-interval", "1000000", "--keep-interval-updates", "1", "--no-epoch-checkpoints"]


def dev_bleu_args(remove, gen=None):
    """fairseq's dev BLEU (tokenized, segmentation undone by REMOVE; GEN: the decoding) picking checkpoint_best.pt."""
    return ["--eval-bleu", *(["--eval-bleu-args", json.dumps(gen)] if gen else []), "--eval-bleu-remove-bpe", remove,
            "--eval-tokenized-bleu", "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"]


def log_args(interval):
    return ["--log-format", "json", "--log-interval", str(interval)]


def _number(x):
    """1.0 as 1 (how the configs write it), 1.5 as 1.5."""
    return int(x) if float(x).is_integer() else x


def decode_args(dec):
    """The translation_qk task's decoding flags, for test decoding and dev BLEU alike."""
    return ["--length-norm", dec.length_norm.value, "--gnmt-alpha", str(dec.gnmt_alpha),
            "--beam-search", dec.beam_search.value]


def generate_args(cfg, data_bin=None):
    """fairseq-generate decoding flags of the papers (beam 4, GNMT alpha 0.6, max len src + 50) and
    the undoing of the pair's segmentation."""
    dec = cfg.decode
    return ["--user-dir", USER_DIR, "--task", "translation_qk", "--source-lang", cfg.src,
            "--target-lang", cfg.tgt, "--beam", str(dec.beam), "--max-len-a", f"{dec.max_len_a:g}",
            "--max-len-b", str(dec.max_len_b), *decode_args(dec), "--remove-bpe", remove_bpe(cfg, data_bin)]


def fast_args(cfg, precision):
    """train.sh --fast on a CPU: the recipe's cpu.fast flags, and cpu.fast_bf16's too in bf16."""
    return flag_args({**cfg.cpu.fast, **(cfg.cpu.fast_bf16 if precision == "bf16" else {})})


def cpu_env(cfg, environ=None):
    """The environment of a CPU run with the recipe's cpu: settings; a variable the user set wins."""
    env = dict(os.environ if environ is None else environ)
    pins = {}
    if cfg.cpu.threads:
        pins.update(OMP_NUM_THREADS=str(cfg.cpu.threads), MKL_NUM_THREADS=str(cfg.cpu.threads))
    if cfg.cpu.isa:
        pins.update(ATEN_CPU_CAPABILITY=cfg.cpu.isa.lower(), MKL_CBWR=cfg.cpu.isa.upper(),
                    ONEDNN_MAX_CPU_ISA=cfg.cpu.isa.upper())
    for key, value in pins.items():
        env.setdefault(key, value)
    return env


def parser():
    p = Parser(prog="python -m qknorm_pipeline.recipes", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    p_get = sub.add_parser("get", help="print one value of PAIR's recipe")
    p_get.add_argument("pair")
    p_get.add_argument("key")
    p_train = sub.add_parser("train-args", help="fairseq-train arguments for PAIR and SYSTEM")
    p_train.add_argument("pair")
    p_train.add_argument("system")
    p_train.add_argument("--schedule", help="an entry of the config's schedules: (default: train.schedule)")
    p_train.add_argument("--stopping", help="an entry of the config's stopping: (default: the system's)")
    p_train.add_argument("--paper-qknorm-length", action="store_true",
                         help="use the paper's L (model.qknorm_length) instead of computing it from the data")
    p_train.add_argument("--save-dir", help="checkpoint directory")
    for name in ("generate-args", "systems", "schedules"):
        sub.add_parser(name).add_argument("pair")
    for sp in sub.choices.values():
        sp.add_argument("--data-bin", help="PAIR's binarized data (default: $DATA_BIN/PAIR, else data-bin/PAIR)")
    return p


def run(args):
    cfg = load(args.pair, args.data_bin, announce=args.cmd == "train-args")
    if args.cmd == "get":
        value = get(cfg, args.key)
        print("" if value is None else str(value).lower() if isinstance(value, bool)
              else f"{value:g}" if isinstance(value, float) else value)
    elif args.cmd == "train-args":
        print(shlex.join(train_args(cfg, args.system, args.schedule, args.paper_qknorm_length,
                                    args.data_bin, args.save_dir, args.stopping)))
    elif args.cmd == "generate-args":
        print(shlex.join(generate_args(cfg, args.data_bin)))
    elif args.cmd == "systems":
        print(" ".join(cfg.systems))
    elif args.cmd == "schedules":
        print(" ".join(cfg.schedules))


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
