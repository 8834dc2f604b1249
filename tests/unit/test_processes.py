"""qknorm_pipeline/processes.py and fairseq_train.py: Ctrl-C stops a training or a decoding as a
terminal sends it, to the whole process group, and never leaves a half-written file."""
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from qknorm_pipeline.fairseq_train import ctrl_c_after

# a child that says it started (a file with its pid), then works until it is stopped
CHILD = "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); os.rename(sys.argv[1] + '.tmp', " \
        "sys.argv[1]); time.sleep(60)"

# a pipeline command as the scripts run one: through cli.main, which turns Ctrl-C into exit 130
DRIVER = textwrap.dedent("""
    import sys
    from qknorm_pipeline import cli, processes

    def run(args):
        child = [sys.executable, "-c", {child!r}, args.ready]
        if args.what == "train":
            processes.run_training("gl-en/run", args.log, 10, child)
        else:
            processes.decode("gl-en/run", child, args.out, args.log, total=5)

    parser = cli.Parser(tag="pipeline")
    for name in ("what", "ready", "log", "out"):
        parser.add_argument(name)
    sys.exit(cli.main(run, parser))
""").format(child=CHILD)


@pytest.fixture(autouse=True)
def sigint_as_in_a_terminal():
    """A suite started in the background (`cmd &`, as nohup jobs are) inherits SIGINT ignored, and so
    would every child; a command typed in a terminal has Python's handler."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def _started(tmp_path, what):
    """The driver running WHAT ("train" or "decode") in a session of its own, once its child has started:
    (driver, the child's pid, the decoding's output path)."""
    ready, log, out = tmp_path / "ready", tmp_path / "train.log", tmp_path / "generate.out"
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, what, str(ready), str(log), str(out)],
                              stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert driver.poll() is None and time.monotonic() < deadline, driver.stderr.read()
        time.sleep(0.05)
    return driver, int(ready.read_text()), out


def _ctrl_c(tmp_path, what):
    driver, _, out = _started(tmp_path, what)
    os.killpg(driver.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
    try:
        driver.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail(f"{what}: Ctrl-C did not stop the child within 20 s")
    return driver.returncode, driver.stderr.read(), out


def test_ctrl_c_stops_a_training_and_says_how_to_resume(tmp_path):
    rc, err, _ = _ctrl_c(tmp_path, "train")
    assert rc == 130 and err.rstrip().endswith("[pipeline] interrupted")
    assert "gl-en/run stopped by Ctrl-C; the same command resumes it from its last checkpoint" in err
    assert "KeyboardInterrupt" in (tmp_path / "train.log").read_text()  # the child got it, not only us


def test_ctrl_c_stops_a_decoding_and_leaves_no_output(tmp_path):
    rc, err, out = _ctrl_c(tmp_path, "decode")
    assert rc == 130 and err.rstrip().endswith("[pipeline] interrupted")
    assert not out.exists() and not list(tmp_path.glob("generate.out*"))


def test_a_checkpoint_is_written_whole_before_ctrl_c_stops_training(tmp_path):
    path = tmp_path / "checkpoint_last.pt"

    def save(n):
        with open(path, "w") as f:
            f.write("a" * n)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C in the middle of the copy
            time.sleep(0.1)
            f.write("b" * n)
        return n

    with pytest.raises(KeyboardInterrupt):
        ctrl_c_after(save)(1000)
    assert path.read_text() == "a" * 1000 + "b" * 1000
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert ctrl_c_after(lambda: 7)() == 7  # no Ctrl-C: the result, nothing raised


def test_command_change_allows_only_a_larger_budget():
    from qknorm_pipeline.processes import command_change

    old = ["data", "--lr", "5e-4", "--max-update", "100"]
    assert command_change(old, list(old)) == "same"
    assert command_change(old, ["data", "--lr", "5e-4", "--max-update", "200"]) == "more-updates"
    assert command_change(old, ["data", "--lr", "5e-4", "--max-update", "50"]) == "different: ... --max-update '100' now '50'"
    assert command_change(old, ["data", "--lr", "1e-3", "--max-update", "200"]) == "different: ... --lr '5e-4' now '1e-3'"
    # words added or left out: the diff's first change, named with the word before it
    assert command_change(old, old + ["--seed", "2"]) == "different: 5 words against 7: '--seed 2' added after '100'"
    assert command_change(old, old[:1] + old[3:]) == "different: 5 words against 3: '--lr 5e-4' left out after 'data'"
    assert command_change(old + ["--seed", "1"], old[:3] + ["--seed", "1"] + old[3:] + ["--seed", "1"]) == \
        "different: 7 words against 9: '--seed 1' added after '5e-4'"
    assert command_change(["data", "--arch", "a", "--lr", "5e-4"], ["data", "--lr", "5e-4", "--arch", "a", "--cpu"]) \
        == "different: 5 words against 6: '--lr 5e-4' added after 'data'"


def test_a_runs_settings_leave_out_the_device_and_keep_the_tokens_per_update():
    from qknorm_pipeline.train import settings

    cpu = ["data", "--max-tokens", "4096", "--cpu", "--lr", "5e-4"]
    gpus = ["data", "--max-tokens", "1024", "--lr", "5e-4", "--distributed-world-size", "4",
            "--distributed-init-method", "env://", "--distributed-no-spawn"]
    assert settings(cpu) == settings(gpus) == ["--max-tokens", "4096", "data", "--lr", "5e-4"]
    assert settings(["data", "--max-tokens", "2048", "--distributed-world-size", "1"]) != settings(cpu)


def test_a_run_moves_between_a_cpu_and_gpus_but_not_to_another_update_size():
    from qknorm_pipeline import train

    def plan(**options):
        return train.settings(train.plan("gl-en", "qknorm", train.Options(**options), check=False).fairseq_args)

    # train.sh's own commands: the GPU ones repeat --max-tokens (the recipe's, then each process's share)
    assert plan() == plan(gpus=1) == plan(gpus=2)
    assert plan(gpus=2, max_tokens_per_gpu=4096) != plan()


def test_sigterm_stops_a_decoding_cleanly_as_ctrl_c_does(tmp_path):
    # a batch system's time limit or `kill -- -PGID`: SIGTERM to the whole process group
    driver, _, _ = _started(tmp_path, "decode")
    os.killpg(driver.pid, signal.SIGTERM)
    try:
        driver.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail("SIGTERM did not stop the decoding within 20 s")
    err = driver.stderr.read()
    assert driver.returncode == 143 and "[pipeline] terminated (SIGTERM)" in err, err
    assert not list(tmp_path.glob("generate.out*"))  # the half-written output removed, as on Ctrl-C


def test_a_plugin_refusal_is_told_from_a_deeper_value_error(tmp_path):
    """A ValueError raised by the plugin's own code names the fix and becomes one line; one from torch
    or fairseq (a bug, a bad tensor) keeps the log's tail."""
    from qknorm_pipeline.processes import _plugin_refusal

    def log(frame, last):
        path = tmp_path / "generate.log"
        path.write_text("2026-11-29 | INFO | fairseq_cli.generate | loading\nTraceback (most recent call last):\n"
                        '  File "/venv/bin/fairseq-generate", line 8, in <module>\n    sys.exit(cli_main())\n'
                        f'  File "{frame}", line 121, in setup_task\n    raise ValueError(problem)\n'
                        "    ^^^^^^^^^^^^^^^^^^^^^^^^^\n" + last + "\n\n")
        return path

    plugin, torch_file = "/work/qknorm_fairseq/task.py", "/venv/lib/python3.12/site-packages/torch/functional.py"
    message = "--decode-precision fp16 needs a CUDA device; decode in fp32 (drop the flag)"
    assert _plugin_refusal(log(plugin, f"ValueError: {message}")) == message
    assert _plugin_refusal(log(torch_file, "ValueError: too many values to unpack (expected 2)")) is None
    assert _plugin_refusal(log(plugin, "RuntimeError: shape mismatch")) is None
    # a checkout named like the plugin, with torch in its virtual environment: torch's frame is not the plugin's
    assert _plugin_refusal(log("/home/me/qknorm_fairseq/.venv/lib/torch/nn.py", f"ValueError: {message}")) is None


def test_a_failed_training_or_decoding_names_its_run_and_its_log(tmp_path, capsys):
    from qknorm_pipeline import processes
    from qknorm_pipeline.cli import UserError

    crash = [sys.executable, "-c", "import sys; print('one last line', flush=True); sys.exit(3)"]
    log = tmp_path / "train.log"
    with pytest.raises(UserError) as failed:
        processes.run_training("gl-en/run", str(log), 10, crash)
    assert str(failed.value) == f"training gl-en/run failed (exit 3); full log: {log}"
    assert "one last line" in capsys.readouterr().err  # the log's tail, shown
    # the plugin's refusal, on fairseq-generate's stderr: one line, the run named
    refuse = [sys.executable, "-c", "import sys; sys.stderr.write('Traceback (most recent call last):\\n"
              "  File \"/x/qknorm_fairseq/task.py\", line 9, in setup_task\\nValueError: use p >= 1\\n'); sys.exit(1)"]
    log = tmp_path / "generate.log"
    with pytest.raises(UserError) as refused:
        processes.decode("gl-en/run", refuse, str(tmp_path / "generate.out"), str(log), total=5)
    assert str(refused.value) == f"fairseq-generate refused gl-en/run: use p >= 1 (full log: {log})"
    assert not list(tmp_path.glob("generate.out*"))


@pytest.mark.parametrize("what", ["train", "decode"])
def test_sigterm_to_the_pipeline_alone_stops_its_child_too(tmp_path, what):
    """`kill PID` of train.sh's or evaluate.sh's Python (not its group): the fairseq child is stopped and waited for
    before the exit, so that no training runs on without the run's lock."""
    driver, child, _ = _started(tmp_path, what)
    os.kill(driver.pid, signal.SIGTERM)
    try:
        driver.wait(timeout=40)
    except subprocess.TimeoutExpired:
        os.killpg(driver.pid, signal.SIGKILL)
        pytest.fail(f"{what}: SIGTERM did not stop the pipeline within 40 s")
    assert driver.returncode == 143 and "[pipeline] terminated (SIGTERM)" in driver.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # gone, and reaped: no zombie left either
