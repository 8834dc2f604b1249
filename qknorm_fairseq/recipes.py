"""Training recipes: the per-pair configs in configs/<pair>.yaml.

Command line (used by the bash pipelines):
    python -m qknorm_fairseq.recipes get PAIR KEY      # KEY is dotted, e.g. data.bpe_merges
"""
import argparse
import os
import sys

import yaml

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


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m qknorm_fairseq.recipes", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_get = sub.add_parser("get", help="print one value of configs/PAIR.yaml")
    p_get.add_argument("pair")
    p_get.add_argument("key")
    args = parser.parse_args(argv)
    if args.cmd == "get":
        value = get(load(args.pair), args.key)
        print("" if value is None else str(value).lower() if isinstance(value, bool) else value)


if __name__ == "__main__":
    sys.exit(main())
