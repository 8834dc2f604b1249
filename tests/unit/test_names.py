"""Run names (qknorm_pipeline/names.py): built by train.sh and the studies, read back by the comparison."""
import pytest

from qknorm_pipeline.names import lr_tag, run_name, split_seed


@pytest.mark.parametrize("kw, name", [
    ({}, "qknorm"),
    ({"seed": 1}, "qknorm"),
    ({"seed": 3}, "qknorm_seed3"),
    ({"schedule": "nowarmup", "seed": 2}, "qknorm_nowarmup_seed2"),
    ({"lr": 1.5e-3, "seed": 2}, "qknorm_lr1.5e-3_seed2"),
    ({"lr": 5e-4}, "qknorm_lr5e-4"),
    ({"multiplier": 2.0}, "qknorm_lr2x"),
])
def test_a_run_name_and_its_seed_read_back(kw, name):
    assert run_name("qknorm", **kw) == name
    assert split_seed(name) == (run_name("qknorm", **{**kw, "seed": None}), kw.get("seed") or 1)


def test_a_system_name_with_underscores_keeps_them():
    assert split_seed("fairseq_transformer_seed12") == ("fairseq_transformer", 12)
    assert split_seed("fairseq_transformer") == ("fairseq_transformer", 1)
    assert split_seed("postnorm_seedless") == ("postnorm_seedless", 1)
    assert lr_tag(2e-3) == "2e-3" and lr_tag(1.25e-4) == "1.25e-4"
