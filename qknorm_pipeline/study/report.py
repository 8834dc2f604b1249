"""A study's report from its runs' records (records.collect, stats.py, render.py): study.md,
study.json, dev_bleu.png and, with several rates per system, test_bleu_lr.png.
"""
import json
import os
import shlex

from ..files import write_atomic
from ..hardware import machine
from . import config, records, stats
from .config import StudyError
from .render import StudyReport, coverage_text, markdown, rate_text


def colour(plt, systems, system):
    """One colour per system of the study, the same in every plot."""
    cycle = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    return cycle[systems.index(system) % len(cycle)]


def plot(found, systems, out, title):
    """Every run's dev BLEU against updates and wall time, coloured by system (SYSTEMS: the study's)."""
    from ..plots import _save, plt  # matplotlib with the Agg backend

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for v in found.values():
        r, curve = v["run"], v["log"]["curve"]
        style = ["-", ":", "-.", (0, (1, 1))][(r.seed - 1) % 4] if v["main"] else "--"
        if r.lr is not None:
            label = f"{r.system} LR {r.lr:g} seed {r.seed}"
        else:
            label = f"{r.system} seed {r.seed}" if v["main"] else f"{r.system} {r.lr_multiplier:g}x LR"
        kw = {"color": colour(plt, systems, r.system), "ls": style, "marker": ".", "label": label, "lw": 1}
        axes[0].plot([p["updates"] for p in curve], [p["bleu"] for p in curve], **kw)
        axes[1].plot([p["wall_s"] / 60 for p in curve], [p["bleu"] for p in curve], **kw)
    axes[0].set_xlabel("updates")
    axes[1].set_xlabel("training wall time, minutes (validation included)")
    for ax in axes:
        ax.set_ylabel("dev BLEU (greedy)")
        ax.grid(alpha=0.3)
    # below both plots, where it hides no curve (savefig's tight box takes it in)
    fig.legend(*axes[0].get_legend_handles_labels(), loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize=7)
    fig.suptitle(title)
    return _save(fig, out)


def lr_plot(cfg, lrs, main, out, title):
    """Test BLEU (seed 1) against the learning rate, one line per system (its colour in plot); a star at
    its chosen rate."""
    from ..plots import _save, plt  # matplotlib with the Agg backend

    fig, ax = plt.subplots(figsize=(7, 4.5))
    rates = sorted({m for r in lrs for m in r["by_lr"]})
    for r in lrs:
        xs = sorted(r["by_lr"])
        c = colour(plt, config.all_systems(cfg), r["system"])
        ax.plot(xs, [r["by_lr"][x]["test"] for x in xs], marker="o", label=r["system"], color=c)
        if main.get(r["system"]) in r["by_lr"]:
            ax.plot([main[r["system"]]], [r["by_lr"][main[r["system"]]]["test"]], marker="*", ms=14, color=c, ls="none")
    ax.set_xscale("log", base=2)
    ax.set_xticks(rates, [rate_text(cfg, m) for m in rates])
    ax.minorticks_off()
    ax.set_xlabel("peak learning rate" if cfg.lr_grid else "multiple of the recipe's peak learning rate")
    ax.set_ylabel(f"test {stats.METRIC.replace('_', '-')} (seed 1)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title)
    return _save(fig, out)


def write(cfg, chosen, where, records_dir, max_update=None, command=None):
    """The report of the runs CHOSEN. COMMAND: the words of the study's --report-only command; the
    report's Command: line adds --runs when the report lacks some of the study's runs."""
    rec = config.recipe(cfg, os.path.join(where.data_bin, cfg.pair))
    ref = os.path.join(where.data, cfg.pair, "tok", f"test.{rec.tgt}")
    if not os.path.isfile(ref):
        raise StudyError(f"no reference {ref}: prepare the study's data first (bash scripts/study.sh --report-only)")
    found = records.collect(chosen, records_dir, ref, rec)
    main = stats.main_rates(cfg, found)
    for v in found.values():
        v["main"] = v["run"].rate == main[v["run"].system]
    rows = stats.main_rows(cfg, found)
    ranked, tests, pooled = stats.neighbours(rows, found)
    claims = stats.claim_tests(cfg, rows, found, pooled)
    lrs = stats.lr_rows(cfg, found)
    n, warmup, interval = config.budget(cfg, max_update)
    total, missing, waiting, short = records.coverage(cfg, found, records_dir, n)
    command = command and shlex.join(command + (["--runs", " ".join(found)] if missing else []))
    r = StudyReport(cfg=cfg, found=found, rows=rows, ranked=ranked, tests=tests, pooled=pooled, claims=claims,
                    sensitivity={"neighbours": stats.pooled_sensitivity(tests, rows, pooled),
                                 "claims": stats.pooled_sensitivity(claims, rows, pooled)},
                    plateau=stats.plateau_rows(found), gaps=stats.checkpoint_gaps(found), lrs=lrs,
                    lr_best=stats.lr_conclusions(lrs) if lrs else ({}, []),
                    lr_last=stats.lr_conclusions(lrs, "last") if lrs else ({}, []),
                    max_update=n, warmup=warmup, interval=interval, peak_lr=config.peak(cfg, rec),
                    signature=next(iter(found.values()))["test"]["sacrebleu_signature"], command=command,
                    coverage=coverage_text(cfg, total, missing, waiting, short, len(found), n))
    out = where.results
    plot(found, config.all_systems(cfg), os.path.join(out, "dev_bleu.png"), f"{cfg.name}: dev BLEU, {n} updates")
    if lrs:
        lr_plot(cfg, lrs, main, os.path.join(out, "test_bleu_lr.png"), f"{cfg.name}: test BLEU, {n} updates")
    m = stats.METRIC
    result = {"name": cfg.name, "max_update": n, "warmup_updates": warmup, "validate_every": interval,
              "machine": machine(), "command": command, "metric": m, "sacrebleu_signature": r.signature,
              "precision": cfg.precision, "runs_in_study": total, "not_in_report": missing,
              "not_named_yet": waiting, "short_of_budget": short, "closed": cfg.closed,
              "systems": rows, "neighbours": tests,
              "family": "pairs of neighbours in the ranking", "alpha": stats.ALPHA,
              "pooled_seed_sd": None if pooled is None else [pooled[0] ** 0.5, pooled[1]],
              "pooled_sd_sensitivity": r.sensitivity,
              "lr": lrs, "rankings": {f"{k:g}": v for k, v in r.lr_best[0].items()}, "hold_at_every_lr": r.lr_best[1],
              "rankings_last_checkpoint": {f"{k:g}": v for k, v in r.lr_last[0].items()},
              "hold_at_every_lr_last_checkpoint": r.lr_last[1],
              "claims": claims, "claims_family": "the config's claims", "plateau": r.plateau,
              "plateau_window": stats.WINDOW,
              "runs": {name: {"system": v["run"].system, "seed": v["run"].seed, "lr_multiplier": v["run"].lr_multiplier,
                              "lr": v["run"].lr,
                              "test": {k: v["test"][k] for k in ("multi_bleu", m, "sacrebleu")},
                              "last": v["last"], "last_source": v["last_source"],
                              **{k: v["log"][k] for k in ("wall_s", "segments", "updates", "curve", "commands",
                                                          "machines")}}
                       for name, v in found.items()}}
    write_atomic(os.path.join(out, "study.json"), json.dumps(result, indent=1) + "\n")
    md = os.path.join(out, "study.md")
    write_atomic(md, markdown(r))
    return md
