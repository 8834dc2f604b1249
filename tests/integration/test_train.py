"""scripts/train.sh as a user runs it: the command it prints, its errors, a short real training."""
import dataclasses
import os
import re
import shlex
import shutil

from qknorm_pipeline.hardware import cpu_name
from qknorm_pipeline.study import records

from helpers import script


def flag(args, name):
    return args[args.index(name) + 1]


def _parse(args):
    """Parses a fairseq-train argument list with fairseq's own parser (raises on a bad flag)."""
    from fairseq import options

    return options.parse_args_and_arch(options.get_training_parser(), input_args=args)


def _train_sh(*argv, **extra_env):
    return script("train.sh", *argv, **extra_env)


def test_train_sh_dry_run_passes_extra_flags_and_picks_the_device(tmp_path):
    p = _train_sh("--dry-run", "gl-en", "qknorm", "--max-update", "7", CKPT_DIR=str(tmp_path / "ck"))
    assert p.returncode == 0, p.stderr
    args = shlex.split(p.stdout)
    assert args[:3] == ["python", "-m", "qknorm_pipeline.fairseq_train"] and args[-2:] == ["--max-update", "7"]  # extra last: they win
    assert flag(args, "--save-dir") == str(tmp_path / "ck" / "gl-en" / "qknorm")
    import torch

    assert ("--cpu" in args) != torch.cuda.is_available()
    # the printed command is what fairseq parses
    ns = _parse(args[3:])
    assert ns.max_update == 7 and ns.arch == "transformer_qknorm"
    # the QKNorm code's stopping (gl->en keeps its base() stop_lr) and the original beam search
    assert (ns.decay_stop_lr, ns.patience, ns.beam_search, ns.positions) == (5e-5, -1, "twt", "qknorm")


def test_train_sh_refuses_bad_input():
    p = _train_sh("--dry-run", "gl-en", "nosuch")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "[train] error: config 'gl-en' has no system 'nosuch'; known: postnorm, prenorm, fixnorm, scalenorm, rmsnorm, "
        "qknorm, lpqknorm, dnas, hnas (see bash scripts/train.sh --help)"]
    p = _train_sh("--precision", "fp8", "gl-en", "qknorm")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "[train] error: --precision must be one of fp32, bf16, fp16, got 'fp8' (see bash scripts/train.sh --help)"]


def test_train_sh_trains_and_writes_the_log(tiny_data, tmp_path):
    # the demo recipe (languages src/tgt) on the tiny corpus, cut short with pass-through flags
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    roots = dict(DATA_BIN=str(tmp_path / "data-bin"), CKPT_DIR=str(tmp_path / "ck"), LOG_DIR=str(tmp_path / "logs"))
    extra = ["--max-update", "4", "--validate-interval-updates", "2", "--num-workers", "0", "--max-tokens", "512",
             "--log-interval", "1", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 5}']
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    save, log = tmp_path / "ck" / "demo" / "postnorm", tmp_path / "logs" / "demo" / "postnorm" / "train.log"
    assert (save / "checkpoint_best.pt").exists() and (save / "checkpoint_last.pt").exists()
    assert f"log {log}, checkpoints {save}/" in p.stderr
    # the progress display without a terminal: a line per validation, then the summary
    assert re.search(r"demo/postnorm 2/4 updates  loss [\d.]+  dev BLEU [\d.]+  lr ", p.stderr), p.stderr
    assert re.search(r"demo/postnorm: 4 updates in \d+:\d\d, loss [\d.]+, best dev BLEU", p.stderr), p.stderr
    assert "| INFO |" not in p.stderr + p.stdout  # fairseq's own lines are in the log only
    text = log.read_text()
    assert re.search(r"\| INFO \| train_inner \| \{.*\"num_updates\": \"4\"", text)
    valid = re.findall(r"\| INFO \| valid \| (\{.*\})", text)
    assert len(valid) == 2 and all('"valid_bleu"' in v for v in valid)  # dev BLEU every 2 updates
    # where it trained, as a study's report reads it from the log (a CPU run: the CPU's line alone)
    (machine,) = records.read_run(str(log))["machines"]
    assert machine.startswith(f"{cpu_name()}, {os.cpu_count()} CPUs, ") and " kernels" in machine, machine
    # the same command again is skipped (resuming is fairseq's, from checkpoint_last.pt: test_lr_scheduler)
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0 and "already trained with this command" in p.stderr
    assert f"(move {save}/ away to train it again)" in p.stderr
    # its .done lost (or a stop between the last save and the end): resumed at its budget, it trains no update
    # more (fairseq's loop would train one past --max-update) and leaves its checkpoints as they were
    last = (save / "checkpoint_last.pt").read_bytes()
    (save / ".done").unlink()
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0 and (save / ".done").exists(), p.stderr[-3000:]
    assert "the checkpoint holds 4 updates, --max-update 4: nothing left to train" in log.read_text()
    assert (save / "checkpoint_last.pt").read_bytes() == last and len(re.findall(r"\| valid \|", log.read_text())) == 2
    # the finished run under another command (a learning rate added): refused before anything starts, naming
    # the words added, its checkpoints and its .done left as they were (not relabelled as trained with that command)
    done, best = (save / ".done").read_text(), (save / "checkpoint_best.pt").read_bytes()
    p = _train_sh("demo", "postnorm", *extra, "--lr", "0.0001", **roots)
    words = shlex.split((save / ".command").read_text())
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"[train] error: demo/postnorm: its checkpoints in {save}/ were trained by another command ({len(words)} words "
        f"against {len(words) + 2}: '--lr 0.0001' added after {words[-1]!r}): train this one under another name "
        "(--name NEW), or move that folder away to start postnorm over"], p.stderr
    assert (save / ".done").read_text() == done and (save / "checkpoint_best.pt").read_bytes() == best
    # a checkpoint_last.pt cut short: one line, nothing launched, the file kept; the fix it names works
    whole = (save / "checkpoint_last.pt").read_bytes()
    (save / "checkpoint_last.pt").write_bytes(whole[: len(whole) // 2])
    longer = [*extra[:1], "6", *extra[2:]]
    p = _train_sh("demo", "postnorm", *longer, **roots)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"[train] error: {save}/checkpoint_last.pt is not a whole checkpoint (cut short?): move it away and train "
        "again, which starts demo/postnorm over, or resumes from a readable checkpoint of this run copied to that "
        "name (checkpoint_best.pt: from its best validation)"], p.stderr
    assert len((save / "checkpoint_last.pt").read_bytes()) == len(whole) // 2
    shutil.copy(save / "checkpoint_best.pt", save / "checkpoint_last.pt")
    p = _train_sh("demo", "postnorm", *longer, **roots)
    assert p.returncode == 0, p.stderr[-3000:]
    assert '"num_updates": "6"' in log.read_text()
    # the data prepared again since (here one dictionary entry more): its checkpoints are not continued, nor
    # called trained on it
    with open(tmp_path / "data-bin" / "demo" / "dict.src.txt", "a") as f:
        f.write("newword 1\n")
    p = _train_sh("demo", "postnorm", *longer, **roots)
    assert p.returncode == 1 and p.stderr.strip().splitlines() == [
        f"[train] error: demo/postnorm: the data in {tmp_path}/data-bin/demo has changed since its checkpoints in "
        f"{save}/ were trained (prepared again?): train this one under another name (--name NEW), or move that "
        "folder away to train postnorm again"], p.stderr
    # ... nor decoded with its vocabulary
    p = script("evaluate.sh", "demo", "postnorm", **roots)
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == (
        f"[evaluate] error: demo/postnorm: the data in {tmp_path}/data-bin/demo has changed since "
        f"{save}/checkpoint_best.pt was trained (prepared again?): its test set would be decoded with another "
        f"vocabulary; prepare the data it was trained on again, or move {save}/ away and train it again (bash "
        "scripts/train.sh demo postnorm)"), p.stderr
    # moved away, the run starts over with a log of its own, the earlier one kept beside it
    shutil.move(save, tmp_path / "old_run")
    shutil.copy(tiny_data / "bin" / "dict.src.txt", tmp_path / "data-bin" / "demo" / "dict.src.txt")
    p = _train_sh("demo", "postnorm", *extra, **roots)
    assert p.returncode == 0, p.stderr[-3000:]
    (kept,) = log.parent.glob("train.*.log")
    assert f"no checkpoint to resume; the earlier log is kept as {kept}" in p.stderr
    assert log.read_text().count("\n# ") + log.read_text().startswith("# ") == 1 and "nothing left" in kept.read_text()


def test_a_setting_the_plugin_refuses_ends_training_with_one_line_naming_the_fix(tiny_data, tmp_path):
    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    roots = dict(DATA_BIN=str(tmp_path / "data-bin"), CKPT_DIR=str(tmp_path / "ck"), LOG_DIR=str(tmp_path / "logs"))
    p = _train_sh("demo", "qknorm", "--qknorm-p", "0.5", "--max-update", "2", "--num-workers", "0", **roots)
    log = tmp_path / "logs" / "demo" / "qknorm" / "train.log"
    assert p.returncode == 1 and p.stderr.strip().splitlines()[-1] == (
        "[train] error: fairseq-train refused demo/qknorm: --qknorm-p 0.5: the l_p 'norm' is not a norm for p < 1; use p >= 1 "
        f"(full log: {log})"), p.stderr[-3000:]
    # the live display shows the error as it comes; the traceback's frames stay in the log (no tail of it)
    assert 'File "' not in p.stderr and 'qknorm_fairseq/model.py", line' in log.read_text(), p.stderr
    assert not (tmp_path / "ck" / "demo" / "qknorm" / "checkpoint_last.pt").exists()


def test_seed_option_names_the_run_and_reaches_fairseq():
    out = script("train.sh", "--dry-run", "--seed", "3", "demo", "qknorm", root="/nonexistent")
    assert out.returncode == 0, out.stderr
    assert "--seed 3" in out.stdout and "/demo/qknorm_seed3" in out.stdout
    bad = script("reproduce.sh", "demo", "--seeds", "0", root="/nonexistent")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == [
        "[reproduce] error: --seeds must be a positive integer, got 0 (see bash scripts/reproduce.sh --help)"]


def test_a_run_being_trained_is_refused_beside_it(tmp_path):
    import pytest

    from qknorm_pipeline import files, train
    from qknorm_pipeline.cli import UserError

    data, save = tmp_path / "data-bin", tmp_path / "ck" / "demo" / "postnorm"
    data.mkdir()
    (data / "dict.src.txt").write_text("")
    save.mkdir(parents=True)
    run = train.Run("demo", "postnorm", "postnorm", ["false"], [str(data)], str(save), str(tmp_path / "train.log"), 10,
                    "CPU", {})
    with files.locked(str(save), lambda: None):  # the other training's lock
        with pytest.raises(UserError, match=r"^demo/postnorm is being trained by another process \(\S+/ck/demo/postnorm/ "
                                            r"is locked\): wait for it to finish, or stop it, then run this command again$"):
            train.train(run)
    assert not (save / ".command").exists()  # nothing of the run was touched
    # the other machines of a multi-node run share the folder with the first, which holds the lock
    other = dataclasses.replace(run, cmd=["false", "--node_rank", "1"])
    with files.locked(str(save), lambda: None):
        with pytest.raises(UserError) as e:
            train.train(other)  # `false` stands for the training: it fails, but past the lock
    assert "is being trained by another process" not in str(e.value) and (save / ".command").exists()


def test_train_sh_fast_adds_the_configs_fast_path_and_trains(tiny_data, tmp_path):
    """--fast: the flags of base.yaml's cpu.fast after the recipe's (and cpu.fast_bf16's in bf16, where this
    CPU has native bf16 and a C++ compiler), before the user's; a short real training with them."""
    import yaml

    from qknorm_fairseq import fused_kernels
    from qknorm_pipeline import hardware, recipes

    cpu = yaml.safe_load(open(os.path.join(recipes.CONFIG_DIR, "base.yaml")))["cpu"]
    assert cpu["fast"] == {"fast_dropout": True, "fused_loss": True, "attention_kernel": "matmul",
                           "packed_decoder": True}
    assert cpu["fast_bf16"] == {"fused_kernels": True, "fused_adam": True, "packed_encoder": True}
    fast = ["--fast-dropout", "--fused-loss", "--attention-kernel", "matmul", "--packed-decoder"]
    p = _train_sh("--dry-run", "--fast", "gl-en", "qknorm", "--max-update", "7", CKPT_DIR=str(tmp_path / "ck"))
    args = shlex.split(p.stdout)
    at = args.index("--cpu") + 1
    assert p.returncode == 0 and args[at:] == [*fast, "--max-update", "7"], p.stderr
    ns = _parse(args[3:])
    assert (ns.fast_dropout, ns.fused_loss, ns.attention_kernel, ns.packed_decoder, ns.fused_kernels) == (
        True, True, "matmul", True, False)

    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    roots = dict(DATA_BIN=str(tmp_path / "data-bin"), CKPT_DIR=str(tmp_path / "ck"), LOG_DIR=str(tmp_path / "logs"))
    bf16 = hardware.cpu_has_bf16() and fused_kernels.has_compiler()
    precision = ["--precision", "bf16"] if bf16 else []
    extra = ["--max-update", "3", "--disable-validation", "--num-workers", "0", "--max-tokens", "512"]
    p = _train_sh(*precision, "--fast", "demo", "qknorm", *extra, **roots)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert f"on CPU ({'bf16' if bf16 else 'fp32'}, fast path)" in p.stderr
    # the run's command as train.sh records it (one --max-tokens, first; no --cpu)
    command = shlex.split((tmp_path / "ck" / "demo" / "qknorm" / ".command").read_text())
    assert ("--bf16" in command) == bf16
    bf16_flags = ["--fused-kernels", "--fused-adam", "--packed-encoder"] if bf16 else []
    assert command[command.index("--fast-dropout"):] == [*fast, *bf16_flags, *extra[:-2]]
    assert 'num_updates": "3"' in (tmp_path / "logs" / "demo" / "qknorm" / "train.log").read_text()


def test_train_sh_fast_on_a_gpu_is_refused():
    p = _train_sh("--dry-run", "--fast", "--gpus", "1", "gl-en", "qknorm")
    assert p.returncode == 2 and p.stderr.strip().splitlines() == [
        "[train] error: --fast is the CPU's fast path; on a GPU the recipe as it is trains fastest "
        "(docs/performance.md): drop --fast (see bash scripts/train.sh --help)"], p.stderr


def test_every_system_trains_on_the_fast_path(tiny_data):
    """Each system of base.yaml, built with the fast path's flags (bf16's too where a C++ compiler is
    found), takes a training step: finite loss and gradients."""
    import torch

    from qknorm_fairseq import fused_kernels
    from qknorm_fairseq.criterion import MaskedLabelSmoothedCrossEntropyCriterion
    from qknorm_pipeline import recipes

    from helpers import build

    cfg = recipes.base()
    precision = "bf16" if fused_kernels.has_compiler() else "fp32"
    for name, system in cfg.systems.items():
        positions = ["--positions", system.positions.value] if system.positions else []
        model, task = build(tiny_data / "bin", system.arch, *positions, "--optimizer", cfg.train.optimizer,
                            *recipes.fast_args(cfg, precision))
        criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                             fused_loss=True)
        task.load_dataset("train")
        data = task.dataset("train")
        model.train()
        loss, _, _ = criterion(model, data.collater([data[i] for i in range(8)]))
        loss.backward()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        assert torch.isfinite(loss) and grads and all(torch.isfinite(g).all() for g in grads), name
