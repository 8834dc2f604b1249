"""Mixed precision against fp32 on a GPU: every system trains a few hundred updates in fp32, bf16
and fp16 with the pair's recipe and the same seed, and the training-loss curves are compared.

usage: bash scripts/precision_check.sh [--pair gl-en] [--updates 300] [--warmup 100] [--jobs 6]
                                       [--systems "postnorm qknorm ..."] [--tolerance 0.05]
       (python -m qknorm_pipeline.precision_check takes the same arguments)

The recipe's warmup is shortened (--warmup) so that the short run reaches the recipe's peak
learning rate; no validation, no checkpoints; --jobs trainings at once on the one GPU. Needs
data-bin/PAIR (scripts/prepare.sh). Every logged update of a bf16/fp16 run is paired with the same
update of the fp32 run of the same system: the largest and mean relative difference of the training
loss, the final losses, whether every loss was finite. A run passes when its losses are finite and
its largest relative difference is within --tolerance. Writes $RESULTS_DIR/gpu/precision.{md,json};
the fairseq logs are in $LOG_DIR/PAIR/SYSTEM_PRECISION/train.log.
Exit status: 0 every run passed, 2 a usage error, 1 a failure or a run that did not pass.
"""
import json
import math
import os
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

from . import hardware, recipes
from .cli import Parser, UsageError, UserError, log, prog
from .cli import main as run_main
from .fairseq_log import LogError, parse_log
from .files import write_atomic
from .paths import folders, short


def curve(path):
    """{update: loss} of a fairseq JSON log's train_inner records."""
    return {int(r["num_updates"]): float(r["loss"]) for r in parse_log(path)["train_inner"]}


def compare(ref, other, tolerance):
    common = sorted(set(ref) & set(other))
    if not common:
        raise LogError("no logged update in common with the fp32 run")
    rel = [abs(other[u] - ref[u]) / abs(ref[u]) for u in common]
    finite = all(math.isfinite(v) for v in other.values())
    return {"updates": len(common), "last_update": common[-1], "final_loss": other[common[-1]],
            "fp32_final_loss": ref[common[-1]], "max_rel_diff": max(rel), "mean_rel_diff": sum(rel) / len(rel),
            "finite": finite, "passed": bool(finite and max(rel) <= tolerance)}


def report(log_dir, systems, settings, out, precisions=None, tolerance=0.05):
    """PREFIX.md / .json comparing every precision's loss curve with fp32's; True when all passed."""
    precisions = precisions or [p for p in recipes.PRECISIONS if p != "fp32"]
    logs = [os.path.join(log_dir, f"{s}_{p}", "train.log") for s in systems for p in ["fp32", *precisions]]
    if not any(map(os.path.isfile, logs)):  # nothing was run: keep the report that is there
        raise UserError(f"no train.log of {' '.join(systems)} in {short(log_dir)}/: run the check without "
                        "--report-only first")
    rows, errors = {}, []
    for system in systems:
        try:
            ref = curve(os.path.join(log_dir, f"{system}_fp32", "train.log"))
        except LogError as e:
            errors.append(f"{system} fp32: {e}")
            continue
        for p in precisions:  # a failed precision does not hide the others
            try:
                other = curve(os.path.join(log_dir, f"{system}_{p}", "train.log"))
                rows.setdefault(system, {})[p] = compare(ref, other, tolerance)
            except LogError as e:
                errors.append(f"{system} {p}: {e}")
    lines = ["# Mixed precision against fp32", "", settings, "",
             f"Training loss at every logged update compared with the fp32 run of the same system and seed; "
             f"pass = every loss finite and the largest relative difference <= {tolerance:g}.", "",
             "| system | precision | logged updates | final loss (fp32) | max rel. diff | mean rel. diff | finite | pass |",
             "|---|---|---|---|---|---|---|---|"]
    for system, by_prec in rows.items():
        for p, r in by_prec.items():
            lines.append(f"| {system} | {p} | {r['updates']} | {r['final_loss']:.3f} ({r['fp32_final_loss']:.3f}) | "
                         f"{r['max_rel_diff']:.4f} | {r['mean_rel_diff']:.4f} | {'yes' if r['finite'] else 'NO'} | "
                         f"{'yes' if r['passed'] else 'NO'} |")
    lines += [f"- missing: {e}" for e in errors]
    write_atomic(out + ".json", json.dumps({"settings": settings, "tolerance": tolerance,
                                            "results": rows, "errors": errors}, indent=1) + "\n")
    write_atomic(out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return not errors and all(r["passed"] for by in rows.values() for r in by.values())


def train_one(pair, system, precision, updates, warmup, where):
    """One short run of SYSTEM in PRECISION, its output in LOG_DIR/PAIR/SYSTEM_PRECISION.out: the
    train step (its fairseq-train command comes from the recipe) in a child process, so that
    --jobs runs share the GPU."""
    import shutil

    name = f"{system}_{precision}"
    for folder in (os.path.join(where.logs, pair, name), os.path.join(where.ckpt, pair, name)):
        shutil.rmtree(folder, ignore_errors=True)
    cmd = [sys.executable, "-m", "qknorm_pipeline.train", "--precision", precision, "--name", name, pair, system,
           "--max-update", str(updates), "--warmup-updates", str(warmup), "--disable-validation", "--no-save",
           "--log-interval", "10", "--num-workers", "0"]
    with open(os.path.join(where.logs, pair, f"{name}.out"), "w") as out:
        ok = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode == 0
    log("precision_check", f"{name}: " + ("done" if ok else f"fairseq-train failed, see {out.name}"))


def parser():
    p = Parser(prog=prog("qknorm_pipeline.precision_check"), tag="precision_check", description=__doc__)
    p.add_argument("--pair", default="gl-en")
    p.add_argument("--updates", type=int, default=300)
    p.add_argument("--warmup", type=int, default=100, help="the shortened warmup, in updates")
    p.add_argument("--jobs", type=int, default=6, help="trainings at once on the GPU")
    p.add_argument("--systems", help='"postnorm qknorm ..." (default: every system of the pair\'s recipe)')
    p.add_argument("--tolerance", type=float, default=0.05, help="largest relative loss difference allowed")
    p.add_argument("--report-only", action="store_true", help="compare the logs already there; train nothing")
    return p


def command_line(a):
    """The command that trains and checks what A asked for (--report-only left out)."""
    systems = ["--systems", a.systems] if a.systems else []
    return shlex.join(["bash", "scripts/precision_check.sh", "--pair", a.pair, "--updates", str(a.updates), "--warmup",
                       str(a.warmup), "--jobs", str(a.jobs), *systems, "--tolerance", repr(a.tolerance)])


def run(a):
    import torch

    for flag, value in (("--updates", a.updates), ("--warmup", a.warmup), ("--jobs", a.jobs)):
        if value < 1:
            raise UsageError(f"{flag} must be a positive integer, got {value}")
    where = folders()
    if not a.tolerance > 0:
        raise UsageError(f"--tolerance must be a positive number, got {a.tolerance}")
    known = list(recipes.load(a.pair).systems)
    systems = a.systems.split() if a.systems else known
    unknown = [s for s in systems if s not in known]
    if unknown:
        raise UsageError(f"--systems: {' '.join(unknown)} not among {a.pair}'s systems ({' '.join(known)})")
    if not a.report_only:
        if not torch.cuda.is_available():
            raise UserError("the precision check needs a CUDA GPU (bf16/fp16 training); torch sees none")
        os.makedirs(os.path.join(where.logs, a.pair), exist_ok=True)
        log("precision_check", f"{a.pair}: {len(systems)} systems x {' '.join(recipes.PRECISIONS)}, {a.updates} updates each, "
                               f"{a.jobs} at a time")
        with ThreadPoolExecutor(a.jobs) as pool:
            list(pool.map(lambda sp: train_one(a.pair, *sp, a.updates, a.warmup, where),
                          [(s, p) for s in systems for p in recipes.PRECISIONS]))
    gpu = hardware.gpu_name() if torch.cuda.is_available() else "no GPU"
    settings = (f"{a.pair} recipe (configs/{a.pair}.yaml), {a.updates} updates, warmup shortened to {a.warmup} updates, "
                f"seed 1, no validation; {gpu}, torch {torch.__version__}; {a.jobs} runs sharing the GPU. Command: "
                f"{command_line(a)}")
    out = os.path.join(where.results, "gpu", "precision")
    if not report(os.path.join(where.logs, a.pair), systems, settings, out, tolerance=a.tolerance):
        raise UserError(f"a precision failed the check or a run is missing: {short(out)}.md says which")


def main(argv=None):
    return run_main(run, parser(), argv)


if __name__ == "__main__":
    sys.exit(main())
