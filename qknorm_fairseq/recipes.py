"""Training recipes: the per-pair configs in configs/<pair>.yaml.

Command line (used by the bash pipelines):
    python -m qknorm_fairseq.recipes get PAIR KEY      # KEY is dotted, e.g. data.bpe_merges
    python -m qknorm_fairseq.recipes train-args PAIR SYSTEM [--schedule S] [--stopping F]
        [--paper-qknorm-length] [--data-bin DIR] [--save-dir DIR]  # fairseq-train arguments, one quoted line
    python -m qknorm_fairseq.recipes generate-args PAIR  # fairseq-generate decoding arguments
    python -m qknorm_fairseq.recipes systems PAIR        # the systems a config defines
    python -m qknorm_fairseq.recipes schedules PAIR      # its learning-rate schedules (TwT Table 4)
"""
import argparse
import json
import os
import shlex
import sys

import yaml
from .cli import Parser

CONFIG_DIR = os.environ.get(
    "QKNORM_CONFIG_DIR", os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs")
)


def available_pairs():
    return sorted(f[: -len(".yaml")] for f in os.listdir(CONFIG_DIR) if f.endswith(".yaml"))


def load(pair):
    path = os.path.join(CONFIG_DIR, f"{pair}.yaml")
    if not os.path.exists(path):
        raise SystemExit(f"unknown pair {pair!r}: no {path}. Known pairs: {', '.join(available_pairs())}")
    with open(path) as f:
        return yaml.safe_load(f)


def get(cfg, key):
    node = cfg
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise SystemExit(f"config for {cfg.get('pair')!r} has no key {key!r}")
        node = node[part]
    return node


USER_DIR = os.path.dirname(os.path.abspath(__file__))
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
    """TwT's peak LR: scale * d^-0.5 * warmup^-0.5 (Eq. 7 at n = warmup)."""
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
    args += ["--eval-bleu", "--eval-bleu-args", json.dumps(gen), "--eval-bleu-remove-bpe", "@@ ",
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


def generate_args(cfg):
    """fairseq-generate decoding flags of the papers (beam 4, GNMT alpha 0.6, max len src + 50)."""
    dec = _section(cfg, "decode")
    return ["--user-dir", USER_DIR, "--task", "translation_qk", "--source-lang", cfg["src"],
            "--target-lang", cfg["tgt"], "--beam", str(dec["beam"]), "--max-len-a", str(dec["max_len_a"]),
            "--max-len-b", str(dec["max_len_b"]), *decode_args(dec), "--remove-bpe", "@@ "]


def main(argv=None):
    parser = Parser(prog="python -m qknorm_fairseq.recipes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_get = sub.add_parser("get", help="print one value of configs/PAIR.yaml")
    p_get.add_argument("pair")
    p_get.add_argument("key")
    p_train = sub.add_parser("train-args", help="fairseq-train arguments for PAIR and SYSTEM")
    p_train.add_argument("pair")
    p_train.add_argument("system")
    p_train.add_argument("--schedule", help="an entry of the config's schedules: (default: its default)")
    p_train.add_argument("--stopping", help="an entry of the config's stopping: (default: the system's)")
    p_train.add_argument("--paper-qknorm-length", action="store_true",
                         help="use the paper's L (model.qknorm_length) instead of computing it from the data")
    p_train.add_argument("--data-bin", help="binarized data (default: data-bin/PAIR)")
    p_train.add_argument("--save-dir", help="checkpoint directory")
    for name in ("generate-args", "systems", "schedules"):
        sub.add_parser(name).add_argument("pair")
    args = parser.parse_args(argv)
    try:
        return _run(args)
    except SystemExit as e:  # the recipe functions stop with a message naming the fix: a usage error
        if not isinstance(e.code, str):
            raise
        print(f"{parser.prog}: error: {e.code}", file=sys.stderr)
        return 2


def _run(args):
    cfg = load(args.pair)
    if args.cmd == "get":
        value = get(cfg, args.key)
        print("" if value is None else str(value).lower() if isinstance(value, bool) else value)
    elif args.cmd == "train-args":
        print(shlex.join(train_args(cfg, args.system, args.schedule, args.paper_qknorm_length,
                                    args.data_bin, args.save_dir, args.stopping)))
    elif args.cmd == "generate-args":
        print(shlex.join(generate_args(cfg)))
    elif args.cmd == "systems":
        print(" ".join(systems(cfg)))
    elif args.cmd == "schedules":
        print(" ".join(k for k in _section(cfg, "schedules") if k != "default"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
