"""Plots of training logs and checkpoints (PNG, matplotlib Agg).

    python -m qknorm_pipeline.plots dev-bleu  --log NAME=train.log [...] --out dev_bleu.png
    python -m qknorm_pipeline.plots grad-norm --log NAME=train.log [...] --out grad_norm.png
    python -m qknorm_pipeline.plots scales    --ckpt NAME=checkpoint_best.pt [...] --out scales.png
    python -m qknorm_pipeline.plots attention --ckpt NAME=checkpoint_best.pt [...] --data-bin DIR
                                             [--index I | --sentence "bpe text"] [--layer L] [--heads H ...]
                                             --out attention.png

``--pair P`` (with ``--log-dir``/``--ckpt-dir``, default logs/ and checkpoints/) takes every
system of a pair instead of ``--log``/``--ckpt``. Logs are fairseq ``--log-format json`` files
(``--log-file``): one JSON object per line, optionally after a ``... | INFO | valid |`` prefix.
dev-bleu = TwT Figure 1, grad-norm = TwT Figure 2 (fairseq's ``gnorm``, before clipping),
scales = TwT Figures 3-4 (ScaleNorm g and QKNorm g per layer, HNAS u = sigmoid(logit)),
attention = QKNorm Figures 1-2 (encoder self-attention of chosen heads for one sentence).
"""
import glob
import math
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .cli import Parser, UsageError, UserError, prog  # noqa: E402
from .cli import main as run_main
from .fairseq_log import parse_log  # noqa: E402
from .files import atomic_path  # noqa: E402
from .paths import ROOT  # noqa: E402


class PlotError(UsageError):
    pass


class NothingToDraw(Exception):
    """No input holds what the plot shows (e.g. a run shorter than fairseq's --log-interval has no
    train_inner record): the plot is not drawn, which is not an error."""


def _named(ap, items, flag):
    """--log/--ckpt NAME=PATH, or a bare PATH named after its folder (logs/PAIR/SYSTEM/train.log: SYSTEM)."""
    pairs = ap.named(items, flag, default_name=lambda p: os.path.basename(os.path.dirname(os.path.abspath(p))) or p)
    if not pairs:
        raise PlotError(f"nothing to plot: give {flag} NAME=PATH or --pair PAIR")
    return pairs


def _from_pair(pair, root, filename):
    found = sorted(glob.glob(os.path.join(root, pair, "*", filename)))
    if not found:
        raise PlotError(f"no {filename} under {os.path.join(root, pair)}/<system>/")
    return [(os.path.basename(os.path.dirname(p)), p) for p in found]


def _save(fig, out):
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format=os.path.splitext(out)[1][1:] or "png", dpi=120, bbox_inches="tight")
    plt.close(fig)
    return out


def _curves(curves, out, xlabel, ylabel, title, **style):
    """One line per (name, x, y) of CURVES."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, x, y in curves:
        ax.plot(x, y, label=name, **style)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    return _save(fig, out)


def _records(logs, kind, key, missing):
    """[(name, the log's KIND records that hold KEY)] of the logs that have any; a log without
    any is left out with a warning; NothingToDraw naming MISSING when none has any."""
    found, empty = [], []
    for name, path in logs:
        recs = [r for r in parse_log(path)[kind] if key in r]
        (found if recs else empty).append((name, recs) if recs else path)
    if not found:
        raise NothingToDraw(f"{', '.join(empty)}: {missing}")
    for path in empty:
        print(f"warning: {path}: {missing}; left out of the plot", file=sys.stderr)
    return found


def plot_dev_bleu(logs, out, title=None):
    # updates, not fairseq epochs: the recipes validate every N updates (the papers' "epoch"),
    # several times within one of fairseq's passes over the data
    def x(r):
        return next(r[k] for k in ("valid_num_updates", "num_updates", "epoch") if k in r)

    curves = [(name, [x(r) for r in valid],
               [r["valid_bleu"] for r in valid])
              for name, valid in _records(logs, "valid", "valid_bleu",
                                          "no validation BLEU (train with --eval-bleu and --log-format json)")]
    return _curves(curves, out, "updates (one point per validation)", "dev BLEU",
                   title or "Development BLEU per validation", marker=".")


def plot_grad_norm(logs, out, title=None):
    curves = [(name, [r["num_updates"] for r in inner], [r["gnorm"] for r in inner])
              for name, inner in _records(logs, "train_inner", "gnorm",
                                          "no train_inner records with gnorm (fewer updates than fairseq's "
                                          "--log-interval, or not --log-format json)")]
    return _curves(curves, out, "update", "global gradient norm (before clipping)",
                   title or "Gradient norm during training", lw=1)


# Parameter names written by qknorm_fairseq/model.py (stock fairseq checkpoints have none).
_SCALENORM_G = re.compile(r"^(encoder|decoder)\.(?:layers\.(\d+)\.)?(\w*layer_norm)\.g$")
_QK_SCALE = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.qk_scale$")
_HNAS = re.compile(r"^(encoder|decoder)\.layers\.(\d+)\.(self_attn|encoder_attn)\.hnas_logit$")
_NORM_ORDER = {"self_attn_layer_norm": 0, "encoder_attn_layer_norm": 1, "final_layer_norm": 2}


def learned_scalars(state_dict):
    """{'scalenorm': [(label, value)], 'qknorm': {group: [(layer, g)]}, 'hnas': {group: [(layer, u)]}}
    in depth order, from parameter names."""
    sn, qk, hn = [], {}, {}
    for name, t in state_dict.items():
        if getattr(t, "dim", lambda: 1)() != 0 and getattr(t, "numel", lambda: 0)() != 1:
            continue
        v = float(t)
        if m := _SCALENORM_G.match(name):
            side, layer, mod = m.group(1), m.group(2), m.group(3)
            # final encoder/decoder norm comes after every layer
            key = (side != "encoder", int(layer) if layer is not None else 10**6, _NORM_ORDER.get(mod, 3))
            label = f"{side[:3]}{'' if layer is None else layer}.{mod.replace('_layer_norm', '') or 'final'}"
            sn.append((key, label, v))
        elif m := _QK_SCALE.match(name):
            qk.setdefault(f"{m.group(1)} {m.group(3)}", []).append((int(m.group(2)), v))
        elif m := _HNAS.match(name):
            hn.setdefault(f"{m.group(1)} {m.group(3)}", []).append((int(m.group(2)), 1 / (1 + math.exp(-v))))
    return {"scalenorm": [(lab, v) for _, lab, v in sorted(sn)],
            "qknorm": {k: sorted(v) for k, v in qk.items()},
            "hnas": {k: sorted(v) for k, v in hn.items()}}


def _load_state(path):
    import torch

    if not os.path.isfile(path):
        raise PlotError(f"checkpoint {path!r} does not exist")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # a file cut short or not a checkpoint: zipfile, pickle and torch each raise their own
        first = str(e).split(". ")[0].splitlines()[0] if str(e) else ""
        raise UserError(f"{path}: not a readable checkpoint ({type(e).__name__}: {first}); was it cut short while "
                        "copied or saved?") from None
    if not isinstance(state, dict) or "model" not in state:
        raise UserError(f"{path}: not a fairseq checkpoint (no 'model' state dict)")
    return state["model"]


def plot_scales(ckpts, out, title=None):
    found = [(name, learned_scalars(_load_state(path))) for name, path in ckpts]
    panels = [k for k in ("scalenorm", "qknorm", "hnas") if any(s[k] for _, s in found)]
    if not panels:
        print("warning: no ScaleNorm g, QKNorm g or HNAS u in these checkpoints "
              "(stock fairseq models have none)", file=sys.stderr)
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(6 * max(len(panels), 1), 4.5), squeeze=False)
    if not panels:
        axes[0][0].text(0.5, 0.5, "no learned ScaleNorm / QKNorm / HNAS scalars\nin: "
                        + ", ".join(n for n, _ in found), ha="center", va="center")
        axes[0][0].set_axis_off()
    for ax, panel in zip(axes[0], panels):
        for name, s in found:
            if panel == "scalenorm" and s["scalenorm"]:
                labels = [lab for lab, _ in s["scalenorm"]]
                ax.plot(range(len(labels)), [v for _, v in s["scalenorm"]], marker="o", label=name)
                ax.set_xticks(range(len(labels)), labels, rotation=70, fontsize=7)
                ax.set_ylabel("learned g")
                ax.set_title("ScaleNorm g by depth")
            elif panel != "scalenorm":
                for group, pts in s[panel].items():
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{name}: {group}")
                ax.set_xlabel("layer")
                ax.set_ylabel("learned g" if panel == "qknorm" else "u (DNAS weight)")
                ax.set_title("QKNorm g per layer" if panel == "qknorm" else "HNAS u per layer")
                if panel == "hnas":
                    ax.axhline(0.5, color="grey", ls="--", lw=0.8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    return _save(fig, out)


def encoder_attention(ckpt, data_bin, index=0, sentence=None, layer=0, split="test"):
    """(tokens, weights[heads, tgt, src]) of encoder layer ``layer``'s self-attention for one
    source sentence, recomputed with need_head_weights from the layer's captured input."""
    import torch
    from fairseq import checkpoint_utils

    import qknorm_fairseq  # noqa: F401  (our models, and torch >= 2.6 loading of fairseq checkpoints)
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([ckpt], arg_overrides={"data": data_bin})
    model = models[0].eval()
    src_dict = task.source_dictionary
    if sentence is not None:
        src = src_dict.encode_line(sentence, add_if_not_exist=False, append_eos=True).long()
    else:
        task.load_dataset(split)
        ds = task.dataset(split)
        if not 0 <= index < len(ds):
            raise PlotError(f"--index {index} out of range: the {split} split has {len(ds)} sentences")
        src = ds[index]["source"]
    layers = model.encoder.layers
    if not 0 <= layer < len(layers):
        raise PlotError(f"--layer {layer} out of range: the encoder has {len(layers)} layers")
    captured = {}

    def hook(module, args, kwargs):
        captured["query"] = kwargs.get("query", args[0] if args else None)
        captured["key_padding_mask"] = kwargs.get("key_padding_mask")

    attn = layers[layer].self_attn
    handle = attn.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model.encoder(src.unsqueeze(0), src_lengths=torch.tensor([len(src)]))
            x = captured["query"]
            # static_kv=True changes nothing for self-attention without incremental state, but
            # keeps fairseq off its F.multi_head_attention_forward fast path, which ignores
            # need_head_weights and returns head-averaged weights.
            _, w = attn(query=x, key=x, value=x, key_padding_mask=captured["key_padding_mask"],
                        need_weights=True, need_head_weights=True, static_kv=True)
    finally:
        handle.remove()
    if w is None or w.dim() != 4:
        raise PlotError(f"{ckpt}: attention returned weights of shape "
                        f"{None if w is None else tuple(w.shape)}, expected (heads, 1, tgt, src)")
    tokens = [src_dict[i] for i in src.tolist()]
    return tokens, w[:, 0].float().numpy()


def plot_attention(ckpts, data_bin, out, index=0, sentence=None, layer=0, heads=None, title=None):
    results = [(name, *encoder_attention(path, data_bin, index, sentence, layer)) for name, path in ckpts]
    n_heads = results[0][2].shape[0]
    heads = heads if heads else list(range(min(n_heads, 4)))
    for h in heads:
        if not 0 <= h < n_heads:
            raise PlotError(f"--heads {h} out of range: the model has {n_heads} heads")
    fig, axes = plt.subplots(len(results), len(heads), figsize=(3.2 * len(heads), 3.2 * len(results)),
                             squeeze=False)
    for r, (name, tokens, w) in enumerate(results):
        for c, h in enumerate(heads):
            ax = axes[r][c]
            ax.imshow(w[h], cmap="viridis", vmin=0, vmax=1)
            ax.set_xticks(range(len(tokens)), tokens, rotation=90, fontsize=6)
            ax.set_yticks(range(len(tokens)), tokens, fontsize=6)
            ax.set_title(f"{name}: layer {layer}, head {h}", fontsize=8)
    fig.suptitle(title or "Encoder self-attention (rows: queries, columns: keys)")
    return _save(fig, out)


def parser():
    ap = Parser(prog=prog("qknorm_pipeline.plots"), tag="plots", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=Parser)
    # log plots read --log NAME=PATH (or every system of --pair under --log-dir), checkpoint plots --ckpt
    for cmd, item, folder, env, default in (("dev-bleu", "log", "log-dir", "LOG_DIR", "logs"),
                                            ("grad-norm", "log", "log-dir", "LOG_DIR", "logs"),
                                            ("scales", "ckpt", "ckpt-dir", "CKPT_DIR", "checkpoints"),
                                            ("attention", "ckpt", "ckpt-dir", "CKPT_DIR", "checkpoints")):
        p = sub.add_parser(cmd)
        p.add_argument(f"--{item}", action="append", metavar="NAME=PATH")
        p.add_argument("--pair")
        p.add_argument(f"--{folder}", default=os.environ.get(env, os.path.join(ROOT, default)))
        p.add_argument("--out", required=True)
        p.add_argument("--title")
        if cmd == "attention":
            p.add_argument("--data-bin", required=True, help="the fairseq-preprocess folder of the pair")
            p.add_argument("--index", type=int, default=0, help="sentence of the test split")
            p.add_argument("--sentence", help="a BPE-segmented source sentence instead of --index")
            p.add_argument("--layer", type=int, default=0)
            p.add_argument("--heads", type=int, nargs="+")
    return ap


def draw(ap, args):
    if args.cmd in ("dev-bleu", "grad-norm"):
        logs = _from_pair(args.pair, args.log_dir, "train.log") if args.pair else _named(ap, args.log, "--log")
        fn = plot_dev_bleu if args.cmd == "dev-bleu" else plot_grad_norm
        return fn(logs, args.out, args.title)
    ckpts = (_from_pair(args.pair, args.ckpt_dir, "checkpoint_best.pt") if args.pair
             else _named(ap, args.ckpt, "--ckpt"))
    if args.cmd == "scales":
        return plot_scales(ckpts, args.out, args.title)
    return plot_attention(ckpts, args.data_bin, args.out, args.index, args.sentence, args.layer, args.heads,
                          args.title)


def main(argv=None):
    ap = parser()

    def run(args):
        try:
            print(draw(ap, args))
        except NothingToDraw as e:
            print(f"[plots] {args.cmd}: nothing to draw, no {os.path.basename(args.out)} written: {e}", file=sys.stderr)

    return run_main(run, ap, argv)


if __name__ == "__main__":
    sys.exit(main())
