"""Mixed precision against fp32: the training-loss curves of short runs, side by side.

    python -m qknorm_pipeline.precision_check --log-dir logs/gl-en --systems postnorm qknorm \
        [--precisions bf16 fp16] [--tolerance 0.05] --out results/gpu/precision

Reads the fairseq JSON logs that `scripts/precision_check.sh` writes (LOG_DIR/PAIR/SYSTEM_PRECISION/
train.log), pairs every logged update of a bf16/fp16 run with the same update of the fp32 run of
the same system, and reports the largest and the mean relative difference of the training loss, the
final losses, and whether every loss was finite. A run passes when its losses are finite and its
largest relative difference is within --tolerance. Writes PREFIX.json and PREFIX.md.
"""
import json
import math
import os
import sys

from .fairseq_log import LogError, parse_log
from .files import write_atomic
from .cli import Parser


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


def main(argv=None):
    ap = Parser(prog="python -m qknorm_pipeline.precision_check", description=__doc__)
    ap.add_argument("--log-dir", required=True, help="LOG_DIR/PAIR holding SYSTEM_PRECISION/train.log")
    ap.add_argument("--systems", nargs="+", required=True)
    ap.add_argument("--precisions", nargs="+", default=["bf16", "fp16"])
    ap.add_argument("--tolerance", type=float, default=0.05, help="largest relative loss difference allowed")
    ap.add_argument("--settings", default="", help="a line describing the runs, copied into the report")
    ap.add_argument("--out", required=True, help="output prefix (PREFIX.json, PREFIX.md)")
    opts = ap.parse_args(argv)
    rows, errors = {}, []
    for system in opts.systems:
        try:
            ref = curve(os.path.join(opts.log_dir, f"{system}_fp32", "train.log"))
        except LogError as e:
            errors.append(f"{system} fp32: {e}")
            continue
        for p in opts.precisions:  # a failed precision does not hide the others
            try:
                other = curve(os.path.join(opts.log_dir, f"{system}_{p}", "train.log"))
                rows.setdefault(system, {})[p] = compare(ref, other, opts.tolerance)
            except LogError as e:
                errors.append(f"{system} {p}: {e}")
    lines = ["# Mixed precision against fp32", "", opts.settings, "",
             f"Training loss at every logged update compared with the fp32 run of the same system and seed; "
             f"pass = every loss finite and the largest relative difference <= {opts.tolerance:g}.", "",
             "| system | precision | logged updates | final loss (fp32) | max rel. diff | mean rel. diff | finite | pass |",
             "|---|---|---|---|---|---|---|---|"]
    for system, by_prec in rows.items():
        for p, r in by_prec.items():
            lines.append(f"| {system} | {p} | {r['updates']} | {r['final_loss']:.3f} ({r['fp32_final_loss']:.3f}) | "
                         f"{r['max_rel_diff']:.4f} | {r['mean_rel_diff']:.4f} | {'yes' if r['finite'] else 'NO'} | "
                         f"{'yes' if r['passed'] else 'NO'} |")
    lines += [f"- missing: {e}" for e in errors]
    write_atomic(opts.out + ".json", json.dumps({"settings": opts.settings, "tolerance": opts.tolerance,
                                                 "results": rows, "errors": errors}, indent=1) + "\n")
    write_atomic(opts.out + ".md", "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 1 if errors or not all(r["passed"] for by in rows.values() for r in by.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
