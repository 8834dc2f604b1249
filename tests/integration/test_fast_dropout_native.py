"""--fast-dropout's C loops in a whole training: the same checkpoint as its torch ops give, which run,
with a warning, where no C compiler is found."""
import subprocess
import sys

import pytest
import torch

from qknorm_fairseq import native

from helpers import REPO, environment, train_args


def train(tiny_data, save_dir, **env):
    args = train_args(tiny_data / "bin", save_dir, "transformer_qknorm", "--max-update", "6", "--max-tokens", "300",
                      "--disable-validation", "--fast-dropout", "--dropout", "0.3", "--attention-dropout", "0.2",
                      "--activation-dropout", "0.1", "--log-format", "json", "--cpu")
    proc = subprocess.run([sys.executable, "-m", "qknorm_pipeline.fairseq_train", *map(str, args)], cwd=REPO,
                          env=environment(**env), capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout + proc.stderr, torch.load(save_dir / "checkpoint_last.pt", weights_only=False)["model"]


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")
def test_the_c_loops_train_the_checkpoint_torchs_ops_train(tiny_data, tmp_path):
    log, ours = train(tiny_data, tmp_path / "c", QKNORM_CACHE=tmp_path / "cache")
    assert list((tmp_path / "cache").glob("fast_dropout-*.so")) and "--fast-dropout:" not in log
    log, theirs = train(tiny_data, tmp_path / "torch", QKNORM_CACHE=tmp_path / "empty", CC="no-such-compiler-qk")
    assert "--fast-dropout: no C compiler ($CC or cc, gcc, clang) on PATH to build fast_dropout.c; masks are " \
           "applied by torch's ops instead" in log
    assert not (tmp_path / "empty").exists()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)
