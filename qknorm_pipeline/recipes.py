"""Training recipes: configs/base.yaml merged with configs/<pair>.yaml (only what differs).

A prepared pair with no file of its own (bash scripts/prepare.sh --pair xx-yy --src-dir DIR) gets
the base recipe with model size and epoch length from its training-set size (size_from_data).

Command line (used by the bash pipelines):
    python -m qknorm_pipeline.recipes get PAIR KEY      # KEY is dotted, e.g. data.bpe_merges
    python -m qknorm_pipeline.recipes train-args PAIR SYSTEM [--schedule S] [--stopping F]
        [--paper-qknorm-length] [--data-bin DIR] [--save-dir DIR]  # fairseq-train arguments, one quoted line
    python -m qknorm_pipeline.recipes generate-args PAIR [--data-bin DIR]  # fairseq-generate decoding arguments
    python -m qknorm_pipeline.recipes systems PAIR        # the systems a config defines
    python -m qknorm_pipeline.recipes schedules PAIR      # its learning-rate schedules (TwT Table 4)
PAIR's prepared data is looked up in --data-bin, else $DATA_BIN/PAIR (default data-bin/PAIR).
"""
import json
import os
import shlex
import sys

import yaml
from .cli import Parser

from .data.stats import REMOVE_BPE, read_stats
from .paths import ROOT

CONFIG_DIR = os.environ.get("QKNORM_CONFIG_DIR", os.path.join(ROOT, "configs"))
BASE = "base"

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
    return os.path.join(os.environ.get("DATA_BIN") or os.path.join(ROOT, "data-bin"), pair)


def _read(path):
    with open(path) as f:
        return yaml.safe_load(f) or {}


def base_recipe():
    return _read(os.path.join(CONFIG_DIR, f"{BASE}.yaml"))


def load(pair, data_bin=None, announce=False):
    """The merged recipe of PAIR. ANNOUNCE: print the sizes chosen from the data, if any."""
    from omegaconf import OmegaConf

    if pair == BASE:
        raise SystemExit(f"{BASE!r} is the recipe every pair starts from, not a pair: name a pair")
    path = os.path.join(CONFIG_DIR, f"{pair}.yaml")
    own = _read(path) if os.path.exists(path) else None
    layers = [base_recipe()]
    if own is None or own.get("size_from_data"):
        data_bin = data_bin or default_data_bin(pair)
        stats = read_stats(data_bin)
        if stats is None:
            raise SystemExit(f"unknown pair {pair!r}: no {path} and no prepared data in {data_bin}. Known pairs: "
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
    layers.append({k: v for k, v in (own or {}).items() if k != "size_from_data"})
    cfg = OmegaConf.to_container(OmegaConf.merge(*[OmegaConf.create(x) for x in layers]))
    cfg["pair"] = pair
    return cfg


def _describe(over):
    flat = [f"{k}={v}" for sec in ("model", "train") for k, v in over[sec].items()]
    flat += [f"stopping.{k}.{a}={b}" for k, d in over.get("stopping", {}).items() for a, b in d.items()]
    return ", ".join(flat)


def remove_bpe(cfg, data_bin=None):
    """fairseq's --remove-bpe value for the pair: from the segmentation prepare.sh recorded in
    DATA_BIN/stats.json, or from the recipe's data.bpe while the pair is not prepared yet."""
    stats = read_stats(data_bin or default_data_bin(cfg["pair"]))
    bpe = stats["bpe"] if stats else cfg["data"]["bpe"]
    if bpe not in REMOVE_BPE:
        raise SystemExit(f"segmentation {bpe!r} of {cfg['pair']} is unknown: it must be one of {', '.join(REMOVE_BPE)}")
    return REMOVE_BPE[bpe]


def get(cfg, key):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SystemExit(f"config for {cfg.get('pair')!r} has no key {key!r}")
        node = node[part]
    return node


USER_DIR = os.path.join(ROOT, "qknorm_fairseq")  # the plugin, passed to fairseq as --user-dir
SCHEDULERS = ("val_decay", "inverse_sqrt")


def _section(cfg, name):
    if not isinstance(cfg.get(name), dict):
        raise SystemExit(f"config for {cfg.get('pair')!r} has no {name}: section (see configs/gl-en.yaml)")
    return cfg[name]


def _need(section, key, where):
    if key not in section or section[key] is None:
        raise SystemExit(f"{where} lacks {key!r}")
    return section[key]


def peak_lr(scale, dim, warmup):
    """TwT's peak LR: scale * d^-0.5 * warmup^-0.5 (Eq. 7 at n = warmup; 4.94e-4 for scale 1,
    d = 512, warmup 8000)."""
    return scale * dim**-0.5 * warmup**-0.5


def stopping(cfg, name):
    """(stop LR, patience) of one entry of the config's stopping: section (a system family)."""
    rules = _section(cfg, "stopping")
    if name not in rules:
        raise SystemExit(f"config {cfg['pair']!r} has no stopping rule {name!r}; known: {', '.join(rules)}")
    where = f"stopping.{name} of {cfg['pair']}"
    return float(_need(rules[name], "stop_lr", where)), int(_need(rules[name], "patience", where))


def schedule_args(cfg, name, stop_lr):
    """fairseq-train flags of one learning-rate schedule of the config's schedules: section."""
    scheds = _section(cfg, "schedules")
    name = name or _need(scheds, "default", "schedules:")
    if name == "default" or name not in scheds:
        known = ", ".join(k for k in scheds if k != "default")
        raise SystemExit(f"config {cfg['pair']!r} has no schedule {name!r}; known: {known}")
    s, where = scheds[name], f"schedules.{name} of {cfg['pair']}"
    kind = _need(s, "scheduler", where)
    if kind not in SCHEDULERS:
        raise SystemExit(f"{where}: scheduler must be one of {SCHEDULERS}, got {kind!r}")
    warmup = int(_need(s, "warmup_updates", where))
    if "lr_scale" in s:  # peak derived as in TwT: lambda * d^-0.5 * warmup^-0.5
        lr = peak_lr(float(s["lr_scale"]), int(_section(cfg, "model")["embed_dim"]), warmup)
    else:
        lr = float(_need(s, "lr", where))
    args = ["--lr-scheduler", kind, "--lr", f"{lr:.6g}", "--warmup-updates", str(warmup)]
    if kind == "val_decay":
        args += ["--decay-factor", str(_need(s, "decay_factor", where)),
                 "--decay-patience", str(_need(s, "decay_patience", where)),
                 "--decay-stop-lr", f"{stop_lr:g}"]
    else:
        args += ["--warmup-init-lr", "0"]
    return args


def systems(cfg):
    return list(_section(cfg, "systems"))


def _flag(key, value):
    flag = "--" + key.replace("_", "-")
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + key.replace("_", "-")]
    return [flag, str(value)]


def train_args(cfg, system, schedule=None, paper_qknorm_length=False, data_bin=None, save_dir=None,
               stopping_rule=None):
    """The fairseq-train argument list for PAIR and SYSTEM (everything but extra user flags)."""
    model, train, decode = _section(cfg, "model"), _section(cfg, "train"), _section(cfg, "decode")
    syst = _section(cfg, "systems")
    if system not in syst:
        raise SystemExit(f"config {cfg['pair']!r} has no system {system!r}; known: {', '.join(syst)}")
    s = syst[system]
    pair = cfg["pair"]
    args = [data_bin or os.path.join("data-bin", pair), "--user-dir", USER_DIR, "--task", "translation_qk",
            "--source-lang", cfg["src"], "--target-lang", cfg["tgt"], "--arch", _need(s, "arch", f"systems.{system}")]
    d, ffn = int(model["embed_dim"]), int(model["ffn_dim"])
    args += ["--encoder-embed-dim", str(d), "--decoder-embed-dim", str(d),
             "--encoder-ffn-embed-dim", str(ffn), "--decoder-ffn-embed-dim", str(ffn),
             "--encoder-layers", str(model["encoder_layers"]), "--decoder-layers", str(model["decoder_layers"]),
             "--encoder-attention-heads", str(model["heads"]), "--decoder-attention-heads", str(model["heads"]),
             "--dropout", str(model["dropout"]), "--attention-dropout", str(model["dropout"]),
             "--activation-dropout", str(model["dropout"])]
    for key, value in (s.get("flags") or {}).items():
        args += _flag(key, value)
    if paper_qknorm_length:
        if not s.get("qknorm"):
            raise SystemExit(f"--paper-qknorm-length: system {system!r} does not use QKNorm")
        length = model.get("qknorm_length")
        if length is None:
            raise SystemExit(f"config {pair!r} has no model.qknorm_length (the papers give none for it): "
                             "drop --paper-qknorm-length to compute L from the training data")
        args += ["--qknorm-length", str(length)]
    epoch = int(_need(train, "epoch_updates", "train:"))
    args += ["--criterion", train["criterion"], "--label-smoothing", str(train["label_smoothing"]),
             "--optimizer", "adam", "--adam-betas", str(train["adam_betas"]), "--adam-eps", str(train["adam_eps"]),
             "--weight-decay", str(train["weight_decay"]), "--clip-norm", str(train["clip_norm"]),
             "--max-tokens", str(train["max_tokens"]), "--seed", str(train.get("seed", 1))]
    stop_lr, patience = stopping(cfg, stopping_rule or _need(s, "stopping", f"systems.{system}"))
    args += schedule_args(cfg, schedule, stop_lr)
    # the original code's "epoch": validate, decay and save every `epoch` updates (task.py)
    args += ["--validate-interval-updates", str(epoch), "--save-interval-updates", str(epoch),
             "--validate-interval", "1000000", "--keep-interval-updates", "1", "--no-epoch-checkpoints",
             "--max-update", str(epoch * int(train["max_epochs"])), "--patience", str(patience)]
    gen = {"beam": decode["beam"], "max_len_a": decode["max_len_a"], "max_len_b": decode["max_len_b"]}
    args += ["--eval-bleu", "--eval-bleu-args", json.dumps(gen), "--eval-bleu-remove-bpe", remove_bpe(cfg, data_bin),
             "--eval-tokenized-bleu", "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric",
             *decode_args(decode)]
    args += ["--log-format", "json", "--log-interval", str(train.get("log_interval", 100))]
    if save_dir:
        args += ["--save-dir", save_dir]
    return args


def decode_args(dec):
    """The translation_qk task's decoding flags, for test decoding and dev BLEU alike."""
    return ["--length-norm", dec["length_norm"], "--gnmt-alpha", str(dec["gnmt_alpha"]),
            "--beam-search", dec.get("beam_search", "fairseq")]


def generate_args(cfg, data_bin=None):
    """fairseq-generate decoding flags of the papers (beam 4, GNMT alpha 0.6, max len src + 50) and
    the undoing of the pair's segmentation."""
    dec = _section(cfg, "decode")
    return ["--user-dir", USER_DIR, "--task", "translation_qk", "--source-lang", cfg["src"],
            "--target-lang", cfg["tgt"], "--beam", str(dec["beam"]), "--max-len-a", str(dec["max_len_a"]),
            "--max-len-b", str(dec["max_len_b"]), *decode_args(dec), "--remove-bpe", remove_bpe(cfg, data_bin)]


def main(argv=None):
    parser = Parser(prog="python -m qknorm_pipeline.recipes", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_get = sub.add_parser("get", help="print one value of PAIR's recipe")
    p_get.add_argument("pair")
    p_get.add_argument("key")
    p_train = sub.add_parser("train-args", help="fairseq-train arguments for PAIR and SYSTEM")
    p_train.add_argument("pair")
    p_train.add_argument("system")
    p_train.add_argument("--schedule", help="an entry of the config's schedules: (default: its default)")
    p_train.add_argument("--stopping", help="an entry of the config's stopping: (default: the system's)")
    p_train.add_argument("--paper-qknorm-length", action="store_true",
                         help="use the paper's L (model.qknorm_length) instead of computing it from the data")
    p_train.add_argument("--save-dir", help="checkpoint directory")
    for name in ("generate-args", "systems", "schedules"):
        sub.add_parser(name).add_argument("pair")
    for p in sub.choices.values():
        p.add_argument("--data-bin", help="PAIR's binarized data (default: $DATA_BIN/PAIR, else data-bin/PAIR)")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except SystemExit as e:  # the recipe functions stop with a message naming the fix: a usage error
        if not isinstance(e.code, str):
            raise
        print(f"{parser.prog}: error: {e.code}", file=sys.stderr)
        return 2


def _run(args):
    cfg = load(args.pair, args.data_bin, announce=args.cmd == "train-args")
    if args.cmd == "get":
        value = get(cfg, args.key)
        print("" if value is None else str(value).lower() if isinstance(value, bool) else value)
    elif args.cmd == "train-args":
        print(shlex.join(train_args(cfg, args.system, args.schedule, args.paper_qknorm_length,
                                    args.data_bin, args.save_dir, args.stopping)))
    elif args.cmd == "generate-args":
        print(shlex.join(generate_args(cfg, args.data_bin)))
    elif args.cmd == "systems":
        print(" ".join(systems(cfg)))
    elif args.cmd == "schedules":
        print(" ".join(k for k in _section(cfg, "schedules") if k != "default"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
