"""One command from nothing to a BLEU table: download -> prepare -> train -> evaluate -> table -> plots.

usage: bash scripts/reproduce.sh [PAIR] [--systems "S1 S2 ..."] [--seeds N] [--gpus N]
                                 [--precision fp32|fp16|bf16] [--fast] [--verbose] [-- extra fairseq-train flags]
       (python -m qknorm_pipeline.reproduce takes the same arguments)

  PAIR (or --pair PAIR)   gl-en sk-en ar-en en-he en-vi (downloads the data; needs internet),
                          demo (the default: an offline synthetic task, systems postnorm and
                          qknorm, minutes on a CPU), or your own pair once prepared:
                          bash scripts/prepare.sh --pair xx-yy --src-dir DIR (no config needed)
Prints one line per stage (what, where, how long), the progress of each training and decoding,
then the table, then draws the plots; everything else goes to log files under $LOG_DIR/PAIR/,
named once. A plot that fails or has nothing to draw says so in one line; the table is already
written. Every stage is idempotent: re-running resumes where an interruption stopped it.
Exit status: 0 ok, 2 a usage error, 1 a failure.
"""
import contextlib
import os
import subprocess
import sys
import time

from . import evaluate as evaluate_step
from . import recipes
from . import train as train_step
from .cli import Parser, UsageError, UserError, log, one_pair, prog
from .cli import main as run_main
from .paths import folders, short

TAG = "reproduce"
DEMO_SYSTEMS = ["postnorm", "qknorm"]
PAPER_SYSTEMS = ["postnorm", "prenorm", "fixnorm", "scalenorm", "qknorm"]  # TwT Table 3 and QKNorm Table 2


@contextlib.contextmanager
def into_log(path):
    """The block's own lines (Python's stderr) go to PATH; with VERBOSE=1 they stay on screen."""
    from .processes import verbose

    if verbose():
        yield
        return
    with open(path, "a", encoding="utf-8") as f, contextlib.redirect_stderr(f):
        yield


def data_stage(pair, where):
    """Download and prepare a pair that has a config; a pair of your own must be prepared already."""
    from .download import download
    from .prepare import prepare

    t0, data_log = time.time(), os.path.join(where.logs, pair, "data.log")
    if pair not in recipes.available_pairs():
        log(TAG, f"data: your own corpus, prepared in {short(os.path.join(where.data_bin, pair))} "
                 "(rerun scripts/prepare.sh --src-dir to change it)")
        return
    os.makedirs(os.path.dirname(data_log), exist_ok=True)
    open(data_log, "w").close()  # each run's own output
    try:
        with into_log(data_log):
            download(pair, where=where)
            prepare(pair, where=where)
    except UserError as e:
        from .processes import tail

        tail(data_log)
        raise UserError(f"preparing the data of {pair} failed: {e}; log: {short(data_log)}") from None
    log(TAG, f"data: {short(os.path.join(where.data_bin, pair))} ready in {time.time() - t0:.0f} s "
             f"(log {short(data_log)})")


def plot_commands(pair, systems, where):
    """(name, command) of every plot: TwT Figures 1-4 and, with a softmax baseline beside qknorm,
    QKNorm Figures 1-2 (results/README.md)."""
    out = os.path.join(where.results, pair)
    plots = [sys.executable, "-m", "qknorm_pipeline.plots"]
    cmds = [("dev_bleu", [*plots, "dev-bleu", "--pair", pair, "--log-dir", where.logs]),
            ("grad_norm", [*plots, "grad-norm", "--pair", pair, "--log-dir", where.logs]),
            ("scales", [*plots, "scales", "--pair", pair, "--ckpt-dir", where.ckpt])]
    base = next((b for b in ("postnorm", "prenorm", "fixnorm", "scalenorm") if b in systems), None)
    if "qknorm" in systems and base:
        ckpt = os.path.join(where.ckpt, pair, "{}", "checkpoint_best.pt")
        cmds.append(("attention", [*plots, "attention", "--ckpt", f"{base}={ckpt.format(base)}",
                                   "--ckpt", f"qknorm={ckpt.format('qknorm')}", "--data-bin",
                                   os.path.join(where.data_bin, pair), "--index", "0", "--layer", "0"]))
    return [(name, [*cmd, "--out", os.path.join(out, f"{name}.png")]) for name, cmd in cmds]


def draw_plots(pair, systems, where):
    """Every plot in its own process, output to plots.log; a failure or an empty plot is one line."""
    t0, plot_log = time.time(), os.path.join(where.logs, pair, "plots.log")
    drawn = []
    with open(plot_log, "w", encoding="utf-8") as f:
        for name, cmd in plot_commands(pair, systems, where):
            p = subprocess.run(cmd, capture_output=True, text=True)
            f.write(f"$ {' '.join(cmd)}\n{p.stdout}{p.stderr}")
            said = [line for line in p.stderr.splitlines() if line.startswith(("warning: ", "[plots]"))]
            for line in said:
                print(line, file=sys.stderr)
            if p.returncode == 0 and p.stdout.strip():
                drawn.append(name)
            elif p.returncode:
                log(TAG, f"plot {name} failed (exit {p.returncode}); log: {short(plot_log)}")
    if drawn:
        log(TAG, f"plots: {short(os.path.join(where.results, pair))}/{{{','.join(drawn)}}}.png in "
                 f"{time.time() - t0:.0f} s (log {short(plot_log)})")
    return drawn


def reproduce(pair="demo", systems=None, seeds=1, train_options=None, train_extra=(), where=None):
    from .scoring.compare import compare

    where = where or folders()
    cfg = recipes.load(pair, os.path.join(where.data_bin, pair))  # an unknown pair stops here
    systems = systems or (DEMO_SYSTEMS if pair == "demo" else PAPER_SYSTEMS)
    for system in systems:  # a misspelt system or option stops here too, not after hours of the others' work
        recipes.system(cfg, system)
    train_step.check_options(train_step.Options(**(train_options or {})))
    t0 = time.time()
    log(TAG, f"{pair}: systems {' '.join(systems)}; logs in {short(os.path.join(where.logs, pair))}/, results in "
             f"{short(os.path.join(where.results, pair))}/")
    data_stage(pair, where)
    for system in systems:
        for seed in range(1, seeds + 1):
            opts = train_step.Options(**(train_options or {}), seed=seed if seed > 1 else None,
                                      extra=list(train_extra))
            run = train_step.plan(pair, system, opts, where)
            train_step.train(run)
            evaluate_step.evaluate(pair, run.name, where=where)
    table = os.path.join(where.results, pair, "compare.md")
    compare(pair, where.results)  # the table first: a plot never stands between a run and its table
    draw_plots(pair, systems, where)
    log(TAG, f"{pair}: finished in {time.time() - t0:.0f} s; table {short(table)}")


def parser():
    p = Parser(prog=prog("qknorm_pipeline.reproduce"), tag=TAG, description=__doc__)
    p.add_argument("pair_arg", nargs="?", metavar="PAIR")
    p.add_argument("--pair", help="the pair (or give it as the first argument); default demo")
    p.add_argument("--systems", default=os.environ.get("SYSTEMS"),
                   help='systems to train and compare, "S1 S2 ..." (SYSTEMS="..." in the environment works too); '
                        "default for the real pairs: postnorm prenorm fixnorm scalenorm qknorm (TwT Table 3 and "
                        "QKNorm Table 2), for the demo: postnorm qknorm")
    p.add_argument("--seeds", type=int, default=1,
                   help="every system with seeds 1..N (runs SYSTEM, SYSTEM_seed2, ...; each resumes on its own); "
                        "the table gives mean ± sd over seeds, every seed's score and a significance test over "
                        "seeds and sentences (docs/training.md)")
    p.add_argument("--gpus", type=int, help="go to scripts/train.sh: N GPU processes, the papers' update size kept")
    p.add_argument("--precision", help=f"goes to scripts/train.sh: {', '.join(recipes.PRECISIONS)}")
    p.add_argument("--fast", action="store_true", help="goes to scripts/train.sh: a CPU's fast path")
    p.add_argument("--verbose", action="store_true", help="every tool's whole output instead of one line per "
                                                          "stage (= VERBOSE=1)")
    p.add_argument("extra", nargs="*", default=[], help="after --: extra fairseq-train flags for every run")
    return p


def run(a):
    if a.seeds < 1:
        raise UsageError(f"--seeds must be a positive integer, got {a.seeds}")
    if a.verbose:
        os.environ["VERBOSE"] = "1"
    opts = {k: v for k, v in (("gpus", a.gpus), ("precision", a.precision), ("fast", a.fast or None)) if v is not None}
    reproduce(one_pair(a, default="demo"), a.systems.split() if a.systems else None, a.seeds, opts, a.extra)


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
