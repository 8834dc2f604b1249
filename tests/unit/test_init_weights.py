"""Every preset's initial weights against a committed table (tests/data/init_weights.json), so that a
refactor cannot change them unnoticed. Each preset is built as fairseq-train builds it (fairseq's
parser, seed 0, the tiny model and corpus of the tests); each parameter is kept as one line "SHAPE SUM
SQUARES", compared to 1e-5 relative (CPU kernels of another instruction set may round the last bit
differently). After an intended change of initialisation, rewrite the table with
    QKNORM_WRITE_INIT_TABLE=1 bash scripts/run_tests.sh tests/unit/test_init_weights.py
and say why in the commit."""
import json
import os

import pytest

from qknorm_fairseq.architectures import PRESETS

from helpers import REPO, build

TABLE = os.path.join(REPO, "tests", "data", "init_weights.json")


def summary(model):
    return {name: f"{'x'.join(map(str, p.shape))} {float(p.double().sum()):.10g} {float(p.double().pow(2).sum()):.10g}"
            for name, p in model.state_dict().items() if p.is_floating_point()}


@pytest.fixture(scope="module")
def table(tiny_data):
    import torch

    now = {"torch": torch.__version__, "presets": {arch: summary(build(tiny_data / "bin", arch)[0])
                                                   for arch in PRESETS}}
    if os.environ.get("QKNORM_WRITE_INIT_TABLE"):
        with open(TABLE, "w", encoding="utf-8") as f:
            json.dump(now, f, indent=1, sort_keys=True)
            f.write("\n")
        pytest.skip(f"{TABLE} rewritten from this code: run again without QKNORM_WRITE_INIT_TABLE to compare")
    with open(TABLE, encoding="utf-8") as f:
        return json.load(f), now


@pytest.mark.parametrize("arch", PRESETS)
def test_initial_weights_are_unchanged(table, arch):
    committed, now = table
    assert arch in committed["presets"], f"{arch} is not in {TABLE}: rewrite it (see this file's docstring)"
    want, got = committed["presets"][arch], now["presets"][arch]
    assert sorted(got) == sorted(want), f"{arch}: parameters added or removed"
    for name, line in want.items():
        shape, *values = line.split()
        got_shape, *got_values = got[name].split()
        assert got_shape == shape, f"{arch}.{name}: shape {got_shape}, the table has {shape}"
        assert [float(v) for v in got_values] == pytest.approx([float(v) for v in values], rel=1e-5, abs=1e-6), (
            f"{arch}.{name}: initial values changed (table made with torch {committed['torch']}, "
            f"this is {now['torch']})")
