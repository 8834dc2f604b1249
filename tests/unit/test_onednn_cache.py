"""The training entry point keeps oneDNN's kernels across epochs (qknorm_pipeline/fairseq_train.py)."""
import os
import subprocess
import sys

from qknorm_pipeline import fairseq_train

from helpers import REPO

VAR, OLD_NAME = fairseq_train.ONEDNN_VARS
VALUE = fairseq_train.ONEDNN_CAPACITY
# what the environment holds when fairseq starts training (its cli_main, stubbed here)
PROBE = ("import os, sys\n"
         "import qknorm_fairseq, fairseq_cli.train as t\n"
         "from qknorm_pipeline import fairseq_train\n"
         f"t.cli_main = lambda: print('seen', os.environ.get({VAR!r}), os.environ.get({OLD_NAME!r}), file=sys.stderr)\n"
         "fairseq_train.main(['data-bin'])\n")


def _seen_by_training(**env):
    e = {k: v for k, v in os.environ.items() if k not in (VAR, OLD_NAME)}
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=dict(e, PYTHONPATH=REPO, **env),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stderr.strip().splitlines()[-1]


def test_the_entry_point_raises_the_capacity_before_fairseq_trains_and_a_users_value_wins():
    assert VAR == "ONEDNN_PRIMITIVE_CACHE_CAPACITY" and int(VALUE) > 1024  # oneDNN's default is 1,024
    assert _seen_by_training() == f"seen {VALUE} None"
    assert _seen_by_training(**{VAR: "2048"}) == "seen 2048 None"
    assert _seen_by_training(**{OLD_NAME: "4096"}) == "seen None 4096"  # oneDNN's older name counts as set


def test_the_cache_a_run_gets():
    assert fairseq_train.onednn_cache({}) == (VAR, VALUE)
    assert fairseq_train.onednn_cache({VAR: "0", OLD_NAME: "8"}) == (VAR, "0")
    assert fairseq_train.onednn_cache({OLD_NAME: "8"}) == (OLD_NAME, "8")
    env = {}
    fairseq_train.keep_onednn_kernels(env)
    assert env == {VAR: VALUE}


def test_the_performance_manual_names_the_value_plain_fairseq_users_export():
    from qknorm_pipeline.paths import ROOT

    with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as f:
        assert f"`{VAR}={VALUE}`" in f.read()
