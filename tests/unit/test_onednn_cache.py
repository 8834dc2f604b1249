"""The training entry point keeps oneDNN's kernels across epochs (qknorm_pipeline/fairseq_train.py)."""
import os
import subprocess
import sys

from qknorm_pipeline import fairseq_train

from helpers import REPO

VAR, VALUE = fairseq_train.ONEDNN_CACHE
PROBE = ("import os, sys; from qknorm_pipeline import fairseq_train\n"
         "sys.argv = ['fairseq-train', '--help']\n"
         "try: fairseq_train.main(['--help'])\n"
         "except SystemExit: pass\n"
         f"print('capacity', os.environ.get({VAR!r}), file=sys.stderr)")


def _capacity_seen_by_training(**env):
    e = {k: v for k, v in os.environ.items() if k != VAR}
    p = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=dict(e, PYTHONPATH=REPO, **env),
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]
    return p.stderr.strip().splitlines()[-1]


def test_the_entry_point_raises_the_capacity_before_fairseq_trains_and_a_users_value_wins():
    assert VAR == "ONEDNN_PRIMITIVE_CACHE_CAPACITY" and int(VALUE) > 1024  # oneDNN's default is 1,024
    assert _capacity_seen_by_training() == f"capacity {VALUE}"
    assert _capacity_seen_by_training(**{VAR: "2048"}) == "capacity 2048"


def test_keep_onednn_kernels_sets_only_an_unset_variable():
    env = {}
    fairseq_train.keep_onednn_kernels(env)
    assert env == {VAR: VALUE}
    env = {VAR: "0"}
    fairseq_train.keep_onednn_kernels(env)
    assert env == {VAR: "0"}


def test_the_performance_manual_names_the_value_plain_fairseq_users_export():
    from qknorm_pipeline.paths import ROOT

    with open(os.path.join(ROOT, "docs", "performance.md"), encoding="utf-8") as f:
        assert f"`{VAR}={VALUE}`" in f.read()
