"""Running the external programs of a step (fairseq-train, fairseq-generate, fairseq-preprocess,
fastBPE): their whole output goes to a log file whose path is printed, the user sees one line per
stage and the live progress (progress.py), and a failure shows the log's last lines. Also the
`.done` marks by which every stage knows it finished with the same settings."""
import datetime
import difflib
import os
import re
import shlex
import signal
import subprocess
import sys

from . import progress
from .cli import UsageError, UserError
from .files import atomic_path, write_atomic
from .paths import short


def verbose():
    return progress.verbose_env()


def tail(path, n=15):
    """The last N lines of a log, shown on failure (unless VERBOSE showed everything already)."""
    if not verbose() and os.path.exists(path):
        with open(path, encoding="utf-8", errors="replace") as f:
            sys.stderr.write("".join(f.readlines()[-n:]))


def run_logged(cmd, log_path, what, env=None, cwd=None):
    """Run CMD with its output appended to LOG_PATH (and shown with VERBOSE=1); a failure is a
    UserError naming WHAT and the log."""
    os.makedirs(os.path.dirname(os.path.abspath(log_path)), exist_ok=True)
    with open(log_path, "ab") as log:
        if verbose():
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
            for line in proc.stdout:
                log.write(line)
                sys.stderr.buffer.write(line)
            rc = proc.wait()
        else:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd).returncode
    if rc:
        tail(log_path)
        raise UserError(f"{what} failed (exit {rc}); log: {short(log_path)}")


def _start(cmd, **popen):
    """Start CMD, then ignore Ctrl-C here until it ends: the child, in our process group, gets the
    signal, stops, and we keep reading its last words into the log. (Ignoring it before the start
    would make the child ignore it too: an ignored signal stays ignored across exec, and Python
    then installs no KeyboardInterrupt handler.) Returns the process and the handler to restore."""
    proc = subprocess.Popen(list(map(str, cmd)), **popen)
    return proc, signal.signal(signal.SIGINT, signal.SIG_IGN)


def _follow(proc, follow):
    """follow(), then PROC's exit status. Where this process stops first (SIGTERM to it alone, an error), PROC
    is stopped too (SIGTERM, SIGKILL after 30 s) and waited for: no training goes on without the run's lock."""
    try:
        follow()
        return proc.wait()
    except BaseException:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        raise


def _stopped_by_ctrl_c(rc):
    return rc in (-signal.SIGINT, 128 + signal.SIGINT)


def _refused_flag(log_path):
    """fairseq's own one-line message when its argument parser refused a flag (exit 2)."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        errors = [line for line in f if re.search(r"(^|: )error: ", line)]
    return errors[-1].strip().split("error: ", 1)[-1] if errors else "a flag was refused"


def run_training(label, log_path, max_update, cmd, env=None, python_warnings="show"):
    """Run a training command with its whole output appended to LOG_PATH after a `# DATE COMMAND`
    line (one per start: the wall-time segments of study/records.py), shown through the progress
    display."""
    os.makedirs(os.path.dirname(log_path), exist_ok=True)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(log_path, "a", encoding="utf-8") as f:
        f.write(f"# {stamp} {shlex.join(map(str, cmd))}\n")
    proc, old = _start(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env)
    try:
        rc = _follow(proc, lambda: progress.follow_training(proc.stdout, log_path, label, max_update=max_update,
                                                            python_warnings=python_warnings))
    finally:
        signal.signal(signal.SIGINT, old)
    if _stopped_by_ctrl_c(rc):
        print(progress.stamp("train", f"{label} stopped by Ctrl-C; the same command resumes it from its last "
                                      f"checkpoint (log: {short(log_path)})"), file=sys.stderr, flush=True)
        raise KeyboardInterrupt
    if rc:
        raise _failure(rc, log_path, "fairseq-train", label, "training")


def decode(label, cmd, out_path, log_path, total, env=None):
    """fairseq-generate's standard output into OUT_PATH (written whole or not at all), its log into
    LOG_PATH, the progress counted from its S- lines."""
    with atomic_path(out_path) as tmp, open(log_path, "wb") as err:
        proc, old = _start(cmd, stdout=subprocess.PIPE, stderr=None if verbose() else err, env=env)
        try:
            rc = _follow(proc, lambda: progress.follow_decoding(proc.stdout, tmp, label, total))
        finally:
            signal.signal(signal.SIGINT, old)
        if _stopped_by_ctrl_c(rc):
            raise KeyboardInterrupt  # nothing written: the next run decodes again
        if rc:
            raise _failure(rc, log_path, "fairseq-generate", label, "decoding")


def _failure(rc, log_path, program, label, doing):
    """The error for PROGRAM's exit RC (not 0) while DOING run LABEL: its flag refused by fairseq's
    parser (exit 2) or a setting refused by the plugin, in one line; otherwise the log's tail is
    shown."""
    if rc == 2:
        return UsageError(f"{program} refused {label}: {_refused_flag(log_path)} (full log: {short(log_path)})")
    refusal = _plugin_refusal(log_path)
    if refusal:
        return UserError(f"{program} refused {label}: {refusal} (full log: {short(log_path)})")
    tail(log_path)
    return UserError(f"{doing} {label} failed (exit {rc}); full log: {short(log_path)}")


def _plugin_refusal(log_path):
    """The plugin refuses a setting it cannot honour with a ValueError that names the fix: that
    message when the log ends in one raised by the plugin's own code (the traceback's last frame a
    file of qknorm_fairseq/), else None; a ValueError from deeper down keeps the log's tail."""
    with open(log_path, encoding="utf-8", errors="replace") as f:
        lines = [line.strip() for line in f if line.strip()]
    if not lines or not lines[-1].startswith("ValueError: "):
        return None
    frames = [line.split('"')[1] for line in lines if line.startswith('File "')]
    if not frames or os.path.basename(os.path.dirname(frames[-1])) != "qknorm_fairseq":  # the plugin is one flat package
        return None
    return lines[-1].removeprefix("ValueError: ")


# --- done marks -------------------------------------------------------------------------------

def command_change(old, new):
    """How the command words NEW stand against OLD, those that made a run's checkpoints: 'same';
    'more-updates' when the one difference is a larger --max-update (a raised budget continues the
    run from its checkpoints); otherwise 'different: ...' naming the first difference."""
    if len(old) != len(new):
        return f"different: {len(old)} words against {len(new)}" + _first_change(old, new)
    more = False
    for i, (x, y) in enumerate(zip(old, new)):
        if x == y:
            continue
        if i and old[i - 1] == "--max-update" and x.isdigit() and y.isdigit() and int(y) > int(x):
            more = True
            continue
        return f"different: ... {old[i - 1] if i else ''} {x!r} now {y!r}"
    return "more-updates" if more else "same"


def _first_change(old, new):
    """': WORDS added', ': WORDS left out' or ': WORDS now WORDS', for the first words where OLD and NEW part, after
    the word before them (a diff of the two lists)."""
    matcher = difflib.SequenceMatcher(a=old, b=new, autojunk=False)
    tag, i1, i2, j1, j2 = next(op for op in matcher.get_opcodes() if op[0] != "equal")
    where = f" after {old[i1 - 1]!r}" if i1 else " at the start"
    gone, come = shlex.join(old[i1:i2]), shlex.join(new[j1:j2])
    change = {"insert": f"{come!r} added", "delete": f"{gone!r} left out"}.get(tag, f"{gone!r} now {come!r}")
    return f": {change}{where}"


def mark_done(folder, key=""):
    """Record (atomically, in FOLDER/.done) that the stage in FOLDER finished with the settings KEY."""
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    write_atomic(os.path.join(folder, ".done"), (f"{key}\n" if key else "") + stamp + "\n")


def is_done(folder, key=None):
    """The stage in FOLDER finished (with the settings KEY, when given)."""
    path = os.path.join(folder, ".done")
    if not os.path.isfile(path):
        return False
    if key is None:
        return True
    with open(path, encoding="utf-8") as f:
        return f.readline().rstrip("\n") == key
