"""The training entry point under QKNORM_MALLOC: the allocator it names is the one in the process,
its results are the same bits as under glibc's malloc, and a choice that cannot be had stops it."""
import re
import subprocess
import sys

import pytest
import torch

from qknorm_pipeline import allocator

from helpers import REPO, environment, train_args

FOUND = allocator.resolve("auto", allocator.search_dirs())


def train(tiny_data, save_dir, malloc):
    args = train_args(tiny_data / "bin", save_dir, "transformer_qknorm", "--max-update", "6", "--max-tokens", "300",
                      "--disable-validation", "--dropout", "0.3", "--log-format", "json", "--cpu")
    proc = subprocess.run([sys.executable, "-m", "qknorm_pipeline.fairseq_train", *map(str, args)], cwd=REPO,
                          env=environment(**{allocator.VAR: malloc}), capture_output=True, text=True)
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.skipif(FOUND[1] is None, reason="no tcmalloc or jemalloc on this machine (apt install libtcmalloc-minimal4)")
def test_a_preloaded_allocator_trains_the_same_bits(tiny_data, tmp_path):
    name, path = FOUND
    runs = {m: train(tiny_data, tmp_path / m, m) for m in ("system", name)}
    for rc, log in runs.values():
        assert rc == 0, log[-2000:]
    assert "memory allocator: glibc's malloc (QKNORM_MALLOC=system)" in runs["system"][1]
    # the log names the library the process mapped (a symlink's target)
    assert f"memory allocator: {name} (" in runs[name][1]
    states = [torch.load(tmp_path / m / "checkpoint_last.pt", weights_only=False)["model"] for m in runs]
    assert states[0].keys() == states[1].keys()
    assert all(torch.equal(states[0][k], states[1][k]) for k in states[0])


def test_an_allocator_that_cannot_be_had_stops_the_run_before_training(tiny_data, tmp_path):
    rc, log = train(tiny_data, tmp_path / "a", "tc-malloc")
    assert rc == 1 and "num_updates" not in log
    assert log.strip().splitlines()[-1].startswith("[fairseq_train] error: QKNORM_MALLOC=tc-malloc: give one of")
    # a file that is no library: the dynamic linker skips it, the second start says so and stops
    fake = tmp_path / "libtcmalloc.so"
    fake.write_text("not a library\n")
    rc, log = train(tiny_data, tmp_path / "b", str(fake))
    assert rc == 1 and "num_updates" not in log
    assert f"[fairseq_train] error: QKNORM_MALLOC: LD_PRELOAD={fake} did not load it" in log


@pytest.mark.skipif(FOUND[1] is None, reason="no tcmalloc or jemalloc on this machine (apt install libtcmalloc-minimal4)")
def test_evaluate_decodes_the_same_hypotheses_under_the_allocator(tiny_pipeline, tmp_path):
    name = FOUND[0]
    hyps = {}
    for malloc in ("system", "auto"):
        results = tmp_path / malloc
        proc = subprocess.run(["bash", "scripts/evaluate.sh", "demo", "postnorm"], cwd=REPO, capture_output=True,
                              text=True, env=environment(tiny_pipeline, RESULTS_DIR=results, **{allocator.VAR: malloc}))
        assert proc.returncode == 0, proc.stderr[-2000:]
        expected = "glibc's malloc" if malloc == "system" else name
        assert re.search(rf"decoding demo/postnorm: 40 test sentences with \S+ \({expected}\); log", proc.stderr)
        hyps[malloc] = (results / "demo" / "postnorm" / "hyp.txt").read_text()
    assert hyps["system"] == hyps["auto"] and hyps["auto"].count("\n") == 40
