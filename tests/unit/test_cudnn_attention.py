"""The plugin's import switches cuDNN attention off (qknorm_fairseq/cudnn_attention.py)."""
import os
import subprocess
import sys

from helpers import REPO

PROBE = ("import torch; before = torch.backends.cuda.cudnn_sdp_enabled(); import qknorm_fairseq; "
         "print(before, torch.backends.cuda.cudnn_sdp_enabled())")


def _run(code, **env):
    e = {k: v for k, v in os.environ.items() if k != "QKNORM_CUDNN_ATTENTION"}
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=dict(e, PYTHONPATH=REPO, **env),
                          capture_output=True, text=True)


def test_plugin_import_turns_cudnn_attention_off_and_the_variable_keeps_it():
    assert _run(PROBE).stdout.split() == ["True", "False"]
    assert _run(PROBE, QKNORM_CUDNN_ATTENTION="1").stdout.split() == ["True", "True"]
    assert _run(PROBE, QKNORM_CUDNN_ATTENTION="0").stdout.split() == ["True", "False"]


def test_the_training_entry_point_applies_it_before_fairseq_trains():
    code = ("import sys, torch; from qknorm_pipeline import fairseq_train\n"
            "sys.argv = ['fairseq-train', '--help']\n"
            "try: fairseq_train.main(['--help'])\n"
            "except SystemExit: pass\n"
            "print('cudnn', torch.backends.cuda.cudnn_sdp_enabled(), file=sys.stderr)")
    p = _run(code)
    assert p.returncode == 0 and "cudnn False" in p.stderr, p.stderr[-2000:]


def test_a_bad_value_is_one_line_naming_the_fix():
    p = _run("import qknorm_fairseq", QKNORM_CUDNN_ATTENTION="yes")
    assert p.returncode != 0
    assert p.stderr.strip().splitlines()[-1] == (
        "ValueError: QKNORM_CUDNN_ATTENTION='yes': set it to 1 (keep cuDNN attention) or 0 (off, the default), "
        "or unset it")


def test_a_benchmark_record_names_the_settings_it_ran_under(monkeypatch):
    from qknorm_fairseq import cudnn_attention
    from qknorm_pipeline.benchmark import throughput
    from qknorm_pipeline.fairseq_train import ONEDNN_CAPACITY, ONEDNN_VARS

    assert throughput.CUDNN_ENV == cudnn_attention.ENV
    cmd = [sys.executable, "-m", "qknorm_pipeline.fairseq_train", "/scratch/x/ckpt"]
    for var in (cudnn_attention.ENV, *ONEDNN_VARS):
        monkeypatch.delenv(var, raising=False)
    run = "python -m qknorm_pipeline.fairseq_train '$SCRATCH/ckpt'"
    assert throughput.recorded(cmd, "/scratch/x", gpu=True) == run
    # on a CPU the size of oneDNN's kernel cache the run had (the entry point's, or the user's) and its allocator
    assert throughput.recorded(cmd, "/scratch/x") == (
        f"ONEDNN_PRIMITIVE_CACHE_CAPACITY={ONEDNN_CAPACITY} QKNORM_MALLOC=system {run}")
    assert throughput.recorded(cmd, "/scratch/x", malloc="tcmalloc") == (
        f"ONEDNN_PRIMITIVE_CACHE_CAPACITY={ONEDNN_CAPACITY} QKNORM_MALLOC=tcmalloc {run}")
    monkeypatch.setenv(cudnn_attention.ENV, "1")
    monkeypatch.setenv(ONEDNN_VARS[0], "1024")
    assert throughput.recorded(cmd, "/scratch/x", gpu=True) == f"QKNORM_CUDNN_ATTENTION=1 {run}"
    assert throughput.recorded(cmd, "/scratch/x") == (
        f"QKNORM_CUDNN_ATTENTION=1 ONEDNN_PRIMITIVE_CACHE_CAPACITY=1024 QKNORM_MALLOC=system {run}")
