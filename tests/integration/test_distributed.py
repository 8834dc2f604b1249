"""fairseq's data-parallel training with the plugin: two real processes on CPU over gloo."""
import json
import os
import re
import socket
import subprocess
import sys

import pytest

from helpers import REPO, TINY_MODEL, USER_DIR, environment

# ValDecay with patience 1 and a high stop LR, so that a tiny run decays and stops within budget.
RECIPE = ["--task", "translation_qk", "--arch", "transformer_qknorm", *TINY_MODEL, "--share-all-embeddings",
          "--criterion", "masked_label_smoothed_cross_entropy", "--label-smoothing", "0.1",
          "--optimizer", "adam", "--lr", "0.01", "--lr-scheduler", "val_decay", "--warmup-updates", "0",
          "--decay-factor", "0.5", "--decay-patience", "1", "--decay-stop-lr", "0.003",
          "--max-tokens", "300", "--max-update", "150", "--validate-interval-updates", "5",
          "--save-interval-updates", "5", "--validate-interval", "1000", "--keep-interval-updates", "1",
          "--no-epoch-checkpoints", "--eval-bleu", "--eval-bleu-args", '{"beam": 1}', "--eval-tokenized-bleu",
          "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric", "--seed", "1",
          "--num-workers", "0", "--log-format", "json", "--log-interval", "1", "--cpu"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(data_bin, save_dir, n, *extra, entry=("-m", "qknorm_pipeline.fairseq_train"), timeout=150):
    """Run n ranks of fairseq-train (one process each, as torchrun or Slurm would); their outputs."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    dist = []
    port = free_port()
    procs = []
    for rank in range(n):
        if n > 1:
            dist = ["--distributed-world-size", str(n), "--distributed-rank", str(rank), "--distributed-backend",
                    "gloo", "--distributed-init-method", f"tcp://127.0.0.1:{port}", "--distributed-no-spawn"]
        cmd = [sys.executable, *entry, str(data_bin), "--user-dir", USER_DIR, "--save-dir", str(save_dir),
               *RECIPE, *dist, *extra]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=timeout)[0] for p in procs]
    finally:
        for p in procs:
            p.kill()
    return [(p.returncode, out) for p, out in zip(procs, outs)]


def decisions(out):
    """ValDecay's per-validation lines, with the rank tag removed."""
    return [re.sub(r"\[rank \d+/\d+\] ", "", m) for m in re.findall(r"(\[rank \d+/\d+\] val_decay: .*)", out)]


def losses(out):
    recs = [json.loads(line[line.index("{"):]) for line in out.splitlines() if '"loss"' in line and "train_inner" in line]
    return {int(r["num_updates"]): float(r["loss"]) for r in recs}


def fairseq_bin(tool):
    return os.path.join(os.path.dirname(sys.executable), f"fairseq-{tool}")


def test_two_ranks_agree_decay_stop_and_resume_in_one_process(tiny_data, tmp_path):
    save = tmp_path / "ckpt"
    (rc0, out0), (rc1, out1) = launch(tiny_data / "bin", save, 2)
    assert rc0 == 0 and rc1 == 0, out0[-3000:] + out1[-3000:]
    assert "legacy_ddp" in out0  # chosen for CPUs by python -m qknorm_pipeline.fairseq_train
    d0, d1 = decisions(out0), decisions(out1)
    # the same decision at every validation on both ranks, at least one decay, and the stop
    assert d0 == d1 and len(d0) >= 3, (d0, d1)
    assert any("worse than" in d for d in d0), d0
    stop = [d for d in d0 if "< --decay-stop-lr" in d]
    assert stop, d0
    # fairseq performs one more update after the stop request, validates and saves
    final = int(re.search(r"max_update (\d+)", stop[0]).group(1)) + 1
    assert int(re.search(r"update (\d+)", [d for d in d0 if "val_decay: update" in d][-1]).group(1)) == final
    # both ranks print g0 and the mask themselves, and they agree
    for what in ("QKNorm g0 = [0-9.]+", "target vocabulary mask: [0-9]+ of [0-9]+"):
        assert re.search(r"\[rank 0/2\] " + what, out0).group(0)[12:] == re.search(r"\[rank 1/2\] " + what, out1).group(0)[12:]
    # one set of checkpoints, written by rank 0, at the final update
    ckpts = sorted(os.listdir(save))
    assert ckpts[:2] == ["checkpoint_best.pt", "checkpoint_last.pt"], ckpts
    assert all(re.fullmatch(r"checkpoint_\d+_\d+\.pt", c) for c in ckpts[2:]) and len(ckpts) <= 3, ckpts
    import torch

    state = torch.load(save / "checkpoint_last.pt", map_location="cpu", weights_only=False)
    assert state["optimizer_history"][-1]["num_updates"] == final

    # resume in one process (update-freq 2 keeps the tokens per update), 5 more updates, no stop LR
    (rc, out), = launch(tiny_data / "bin", save, 1, "--update-freq", "2", "--decay-stop-lr", "-1",
                        "--max-update", str(final + 5))
    assert rc == 0, out[-3000:]
    assert re.search(rf"Loaded checkpoint .*checkpoint_last\.pt .*@ {final} updates", out), out[-3000:]
    assert max(losses(out)) == final + 5


def _guard_worker(rank, port, value, out):
    import torch.distributed as dist

    from qknorm_fairseq.distributed import same_on_all_ranks

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
    try:
        same_on_all_ranks("the metric", value(rank))
        out.put((rank, "agreed"))
    except RuntimeError as e:
        out.put((rank, str(e)))
    dist.destroy_process_group()



@pytest.mark.parametrize("rank_local", [False, True])
def test_same_on_all_ranks_raises_on_every_rank_when_they_differ(rank_local):
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    value = _rank_value if rank_local else _shared_value
    mp.start_processes(_guard_worker, args=(free_port(), value, out), nprocs=2, start_method="spawn")
    got = dict(out.get(timeout=60) for _ in range(2))
    if rank_local:
        assert got[0] == got[1] == "the metric differs between ranks: {0: 10.0, 1: 11.0}; every rank must see the " \
                                   "same data and the all-reduced validation metric"
    else:
        assert got == {0: "agreed", 1: "agreed"}


def _rank_value(rank):
    return 10.0 + rank


def _shared_value(rank):
    return 10.0


def test_default_backend_on_cpu_is_refused_with_the_fix(tiny_data, tmp_path):
    results = launch(tiny_data / "bin", tmp_path / "ckpt", 2, "--max-update", "2",
                     entry=(fairseq_bin("train"),), timeout=120)
    for rc, out in results:
        assert rc != 0
        assert "add --ddp-backend legacy_ddp" in out, out[-3000:]


@pytest.mark.parametrize("gpus,tokens", [(1, 4096), (2, 2048), (8, 512)])
def test_train_sh_gpus_dry_run(gpus, tokens):
    out = subprocess.run(["bash", os.path.join(REPO, "scripts/train.sh"), "--dry-run", "--gpus", str(gpus),
                          "--precision", "bf16", "gl-en", "qknorm"], capture_output=True, text=True, check=True,
                         env=environment())
    cmd = out.stdout.split()
    assert cmd[:6] == ["torchrun", "--standalone", "--nproc_per_node", str(gpus), "-m", "qknorm_pipeline.fairseq_train"]
    # the last --max-tokens wins in argparse: the recipe's 4096 tokens per update, split over the GPUs
    assert cmd[len(cmd) - 1 - cmd[::-1].index("--max-tokens") + 1] == str(tokens)
    assert cmd[cmd.index("--distributed-world-size") + 1] == str(gpus)
    assert "--bf16" in cmd and "--cpu" not in cmd
    assert ("--distributed-init-method" in cmd) == (gpus == 1)  # one GPU still takes the distributed path
    assert f"{gpus} GPU processes x {tokens} tokens = 4096 tokens per update" in out.stderr


def test_train_sh_gpus_that_do_not_divide_the_update_are_refused():
    out = subprocess.run(["bash", os.path.join(REPO, "scripts/train.sh"), "--dry-run", "--gpus", "3", "gl-en",
                          "qknorm"], capture_output=True, text=True, env=environment())
    assert out.returncode != 0
    assert "3 GPU processes do not divide the recipe's 4096 tokens per update: pass --max-tokens-per-gpu" in out.stderr


def test_slurm_script_starts_one_torchrun_per_machine(tmp_path):
    # Slurm stand-ins: scontrol names the job's machines, srun runs the task once per machine.
    (tmp_path / "scontrol").write_text('#!/bin/sh\nprintf "gpu-a\\ngpu-b\\n"\n')
    (tmp_path / "srun").write_text('#!/bin/bash\nshift\nfor n in 0 1; do SLURM_NODEID=$n "$@" || exit 1; done\n')
    for f in ("scontrol", "srun"):
        (tmp_path / f).chmod(0o755)
    env = dict(environment(), PATH=f"{tmp_path}:{environment()['PATH']}", SLURM_SUBMIT_DIR=REPO, SLURM_NNODES="2",
               SLURM_JOB_NODELIST="gpu-[a-b]", SLURM_GPUS_ON_NODE="4", QKNORM_USE_ENV="1")
    out = subprocess.run(["bash", os.path.join(REPO, "scripts/slurm_train.sbatch"), "--dry-run", "--precision",
                          "bf16", "gl-en", "qknorm", "--max-update", "10"], capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.strip().splitlines()
    assert len(lines) == 2
    for rank, line in enumerate(lines):
        cmd = line.split()
        assert cmd[:12] == ["torchrun", "--nnodes", "2", "--node_rank", str(rank), "--nproc_per_node", "4",
                            "--master_addr", "gpu-a", "--master_port", "29500", "-m"]
        assert cmd[cmd.index("--distributed-world-size") + 1] == "8" and cmd[-2:] == ["--max-update", "10"]
    assert out.stderr.count("8 GPU processes x 512 tokens = 4096 tokens per update") == 2


# ~1 min: four trainings; prints the numbers docs/scaling.md quotes (-s)
@pytest.mark.parametrize("dropout", ["none", "preset"])
def test_two_ranks_against_one_with_update_freq_2(tiny_data, tmp_path, dropout):
    flags = ["--max-update", "40", "--decay-stop-lr", "-1", "--disable-validation"]
    if dropout == "none":
        flags += ["--dropout", "0", "--attention-dropout", "0", "--word-dropout", "0"]
    (rc0, two), (rc1, _) = launch(tiny_data / "bin", tmp_path / "two", 2, *flags)
    (rc, one), = launch(tiny_data / "bin", tmp_path / "one", 1, "--update-freq", "2", *flags)
    assert rc0 == rc1 == rc == 0, two[-2000:] + one[-2000:]

    def words_per_update(out):
        return [json.loads(line[line.index("{"):])["wpb"] for line in out.splitlines() if "train_inner" in line]

    assert words_per_update(two) == words_per_update(one)  # the same tokens in every update
    a, b = losses(two), losses(one)
    rel = [abs(a[u] - b[u]) / a[u] for u in sorted(a)]
    print(f"\ndropout {dropout}: {len(rel)} updates, largest relative loss difference {max(rel):.4f}, "
          f"mean {sum(rel) / len(rel):.4f}, update 1: {a[1]} (2 ranks) vs {b[1]} (1 rank)")
    assert sorted(a) == sorted(b) == list(range(1, 41)) and max(rel) < 0.1
