"""What a user sees: --help everywhere, one-line usage errors (exit 2), the progress display,
results that are reused only when nothing changed, and results that hold no machine paths."""
import glob
import hashlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys

import pytest

from helpers import REPO, environment

SCRIPTS = sorted(glob.glob(os.path.join(REPO, "scripts", "*.sh")) + glob.glob(os.path.join(REPO, "scripts", "*.sbatch")))
# the doors: scripts/X.sh runs `door qknorm_pipeline.MODULE`
DOORS = {os.path.basename(p): m for p in SCRIPTS for m in re.findall(r"^door (qknorm_pipeline\.[\w.]+)", open(p).read(), re.M)}
# python -m entry points, with their sub-commands
MODULES = {"recipes": ["get", "train-args", "generate-args", "systems", "schedules"],
           "scoring": [], "scoring.compare": [], "plots": ["dev-bleu", "grad-norm", "scales", "attention"],
           "data.demo": [], "benchmark": ["speed", "kernels", "fairseq-train", "validation"], "precision_check": [],
           "fingerprint": [], "study": [], "ablation": [], "train": [], "evaluate": [], "prepare": [], "download": [],
           "reproduce": []}


def env(**extra):
    return environment(**extra)


def sh(script, *argv, **extra):
    return subprocess.run(["bash", os.path.join(REPO, "scripts", script), *argv], capture_output=True, text=True,
                          env=env(**extra))


def py(module, *argv, **extra):
    return subprocess.run([sys.executable, "-m", f"qknorm_pipeline.{module}", *argv], capture_output=True, text=True,
                          env=env(**extra), cwd=REPO)


def module_source(module):
    """The source of a module, or of every module of a package (benchmark/, study/)."""
    path = {"scoring": "scoring/score"}.get(module, module.replace(".", "/"))
    files = glob.glob(os.path.join(REPO, "qknorm_pipeline", path, "*.py")) or [os.path.join(REPO, "qknorm_pipeline",
                                                                                         path + ".py")]
    return "".join(open(f).read() for f in files)


def options_of(source):
    return set(re.findall(r"add_argument\(\s*\"(--[\w-]+)\"", source))


def test_install_and_test_runner_parse_help_before_doing_anything():
    # running these here would build .venv; --help must be the first thing each one looks at
    for name in ("install.sh", "run_tests.sh"):
        body = [ln for ln in open(os.path.join(REPO, "scripts", name)) if ln.strip() and not ln.startswith("#")]
        assert body[0].startswith("case ${1:-} in -h|--help)"), (name, body[0])


def test_every_script_but_the_tools_is_a_thin_door():
    """A script is a door into its Python command: nothing but sourcing lib.sh and `door`."""
    assert sorted(DOORS) == sorted(os.path.basename(p) for p in SCRIPTS if os.path.basename(p) not in (
        "lib.sh", "install.sh", "run_tests.sh", "slurm_train.sbatch"))
    for name in DOORS:
        code = [ln for ln in open(os.path.join(REPO, "scripts", name)) if ln.strip() and not ln.startswith("#")]
        assert len(code) == 2 and code[0].startswith("source ") and code[1].startswith("door "), (name, code)


@pytest.mark.parametrize("script", sorted(DOORS))
def test_every_script_answers_help_with_its_commands_options(script):
    p = sh(script, "--help")
    assert p.returncode == 0, p.stderr
    assert p.stdout.startswith(f"usage: bash scripts/{script}"), p.stdout[:200]
    module = DOORS[script].removeprefix("qknorm_pipeline.")
    text = p.stdout + "".join(sh(script, sub, "--help").stdout for sub in MODULES.get(module, []))
    missing = sorted(o for o in options_of(module_source(module)) if o not in text)
    assert not missing, f"{script} --help lacks {missing}"


def test_benchmark_convergence_is_the_study_under_its_own_name():
    p = sh("benchmark.sh", "--convergence", "--help")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    assert p.stdout.startswith("usage: bash scripts/benchmark.sh --convergence [-h] [--config CONFIG]"), p.stdout[:200]
    assert options_of(module_source("study")) <= set(re.findall(r"--[\w-]+", p.stdout))


@pytest.mark.parametrize("module", sorted(MODULES))
def test_every_module_answers_help_with_every_option(module):
    texts = []
    for sub in [None, *MODULES[module]]:
        p = py(module, *([sub] if sub else []), "--help")
        assert p.returncode == 0 and "Traceback" not in p.stderr, (module, sub, p.stderr[-2000:])
        texts.append(p.stdout)
    options = options_of(module_source(module))
    assert options or module in ("data.demo", "ablation"), module  # these take positional arguments only
    missing = sorted(o for o in options if not any(o in t for t in texts))
    assert not missing, f"{module} --help lacks {missing}"


def test_training_entry_point_answers_help_with_the_models_flags():
    # fairseq-train --arch X --help never lists X's flags (fairseq answers --help before adding them)
    p = py("fairseq_train", "--help")
    assert p.returncode == 0 and "--arch" in p.stdout and "--qknorm-p" not in p.stdout, p.stderr[-2000:]
    assert "add --arch ARCH to list that model's flags too" in p.stdout
    p = py("fairseq_train", "--arch", "transformer_qknorm", "--help")
    model = p.stdout.split("flags of --arch transformer_qknorm (model QKTransformerModel")[1]
    assert p.returncode == 0 and all(f in model for f in ("--qknorm-p", "--positions", "--norm-type", "--fixnorm"))
    # the plugin's task, criterion, optimizer and scheduler flags, each under its own heading
    p = py("fairseq_train", "--arch", "transformer_qknorm", "--task", "translation_qk", "--criterion",
           "masked_label_smoothed_cross_entropy", "--optimizer", "multi_tensor_adam", "--lr-scheduler", "val_decay", "--help")
    assert p.returncode == 0, p.stderr[-2000:]
    sections = re.split(r"^flags of (--[\w-]+ [\w_]+) ", p.stdout, flags=re.M)
    flags = dict(zip(sections[1::2], sections[2::2]))
    assert list(flags) == ["--arch transformer_qknorm", "--task translation_qk",
                           "--criterion masked_label_smoothed_cross_entropy", "--optimizer multi_tensor_adam",
                           "--lr-scheduler val_decay"]
    for chosen, own in (("--task translation_qk", ("--length-buckets", "--compile", "--beam-search")),
                        ("--criterion masked_label_smoothed_cross_entropy", ("--fused-loss", "--label-smoothing")),
                        ("--optimizer multi_tensor_adam", ("--adam-betas",)),
                        ("--lr-scheduler val_decay", ("--decay-stop-lr", "--decay-patience"))):
        assert all(f in flags[chosen] for f in own), (chosen, flags[chosen])


USAGE_ERRORS = [
    ("train.sh", ["--bogus", "demo", "postnorm"], "unknown option --bogus before PAIR SYSTEM; fairseq flags go after"),
    ("train.sh", ["demo"], "need PAIR and SYSTEM"),
    # a name becomes a folder: none that points elsewhere
    ("train.sh", ["--dry-run", "--name", "../../etc", "demo", "qknorm"],
     "--name '../../etc': a name of letters, digits and _ . + - (no / or leading . or -), as it names a folder"),
    ("train.sh", ["--dry-run", "../configs/demo", "qknorm"], "pair '../configs/demo': a name of letters"),
    # after PAIR SYSTEM fairseq would get it (--seed: another seed trained into the recipe's run folder)
    ("train.sh", ["--dry-run", "demo", "qknorm", "--max-update", "9", "--seed", "3"],
     "--seed is train.sh's own option: put it before PAIR SYSTEM (train.sh --seed ... demo qknorm); the flags after "
     "them go to fairseq-train"),
    ("train.sh", ["demo", "qknorm", "--name=x"], "--name is train.sh's own option: put it before PAIR SYSTEM"),
    ("train.sh", ["--precision"], "--precision needs a value"),
    ("train.sh", ["--precision", "fp8", "demo", "postnorm"], "--precision must be one of fp32, bf16, fp16"),
    ("train.sh", ["--dry-run", "demo", "nosuch"], "no system 'nosuch'"),
    ("train.sh", ["--dry-run", "nosuch", "postnorm"], "unknown pair 'nosuch': no configs/nosuch.yaml"),
    ("evaluate.sh", ["demo"], "need PAIR and SYSTEM"),
    ("evaluate.sh", ["nosuch", "postnorm"], "unknown pair 'nosuch'"),
    ("evaluate.sh", ["demo", "nosuch"], "unknown system 'nosuch'"),
    ("reproduce.sh", ["nosuch"], "unknown pair 'nosuch'"),
    ("reproduce.sh", ["--systems"], "--systems needs a value"),
    # checked before any download, preparation or training
    ("reproduce.sh", ["demo", "--systems", "postnorm qknrom"], "config 'demo' has no system 'qknrom'"),
    ("reproduce.sh", ["demo", "--gpus", "0"], "--gpus must be a positive integer, got 0"),
    ("reproduce.sh", ["demo", "--precision", "fp8"], "--precision must be one of fp32, bf16, fp16, got 'fp8'"),
    ("compare.sh", ["nosuch"], "unknown pair 'nosuch'"),
    ("download.sh", [], "name a pair"),
    ("download.sh", ["demo", "--source", "nosuch"], "--source nosuch: the demo is generated here, from no source"),
    ("download.sh", ["nosuch"], "unknown pair 'nosuch': downloadable pairs are ar-en, en-he, en-vi, gl-en, sk-en"),
    ("download.sh", ["gl en"], "for your own corpus run: bash scripts/prepare.sh --pair SRC-TGT --src-dir DIR"),
    ("study.sh", ["--seeds", "0"], "--seeds must be a positive integer, got 0"),
    ("prepare.sh", ["--bogus"], "unknown option --bogus"),
    ("benchmark.sh", ["--reps"], "--reps needs a value"),
    ("benchmark.sh", ["speed", "--dropout", "2"], "--dropout must lie in [0, 1), got 2"),
    ("benchmark.sh", ["speed", "--stock-dropout", "0.3", "0", "1"], "--stock-dropout must lie in [0, 1), got 0.3 0 1"),
    ("benchmark.sh", ["speed", "--device", "tpu"], "--device must be cpu or cuda (cuda:N), got 'tpu'"),
    ("benchmark.sh", ["speed", "--threads", "0"], "--threads must be >= 1"),
    ("benchmark.sh", ["kernels", "--p", "2", "0.5"], "--p 0.5: an l_p norm needs p >= 1"),
    ("compare.sh", ["demo", "--n-samples", "0"], "--n-samples must be at least 2 (the seeded test estimates a variance"),
    ("train.sh", ["--dry-run", "demo", "postnorm", "--max-update", "abc"],
     "--max-update must be a positive whole number, got 'abc'"),
    ("precision_check.sh", ["--bogus"], "unknown option --bogus"),
    ("ablate.sh", ["--bogus"], "unknown option --bogus; fairseq-train flags go after --"),
    ("ablate.sh", ["gl-en"], "the following arguments are required: system"),
    # an empty value (`--name "$RUN"` with RUN unset) is never the default in disguise
    ("train.sh", ["--dry-run", "--name", "", "demo", "postnorm"], "--name needs a value, got an empty string"),
    ("prepare.sh", ["--pair", "demo", "--src-dir", ""], "--src-dir needs a value, got an empty string"),
    ("study.sh", ["--runs", ""], "--runs needs a value, got an empty string"),
]


def test_an_output_folder_that_cannot_be_made_is_one_line_naming_it(tmp_path):
    (tmp_path / "afile").write_text("")
    p = sh("download.sh", "demo", DATA_DIR=str(tmp_path / "afile"))
    assert p.returncode == 1 and p.stderr.strip() == (
        f"[download] error: {tmp_path}/afile/demo: Not a directory; check that path (the output folders are DATA_DIR, "
        "DATA_BIN, CKPT_DIR, LOG_DIR and RESULTS_DIR: docs/usage.md)"), p.stderr


@pytest.mark.parametrize("script,argv,message", USAGE_ERRORS, ids=lambda v: v if isinstance(v, str) else None)
def test_script_usage_errors_are_one_line_and_exit_2(script, argv, message, tmp_path):
    p = sh(script, *argv, CKPT_DIR=str(tmp_path / "ck"), RESULTS_DIR=str(tmp_path / "res"))
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], (p.returncode, p.stderr)
    tag = script.removesuffix(".sh")
    if script == "benchmark.sh":  # its sub-command's tag; speed when none is named
        tag = argv[0] if argv[0] in ("speed", "kernels", "fairseq-train") else "speed"
    assert lines[0].startswith(f"[{tag}] error: ") and lines[0].endswith(" --help)"), lines[0]
    assert "Traceback" not in p.stdout + p.stderr


@pytest.mark.parametrize("module,argv,message", [
    ("recipes", ["get", "nosuch", "src"], "unknown pair 'nosuch'"),
    ("recipes", ["train-args", "demo", "nosuch"], "no system 'nosuch'"),
    ("recipes", ["bogus"], "invalid choice: 'bogus'"),
    ("scoring", ["--ref", "r.txt"], "the following arguments are required: --sys"),
    ("scoring.compare", ["--pair", "demo", "--results-dir", "x", "--metric", "nosuch"], "invalid choice: 'nosuch'"),
    ("plots", ["dev-bleu", "--pair", "demo"], "the following arguments are required: --out"),
    ("fingerprint", ["--file", "nosuch", "--", "x"], "--file nosuch does not exist"),
])
def test_module_usage_errors_are_one_line_and_exit_2(module, argv, message):
    p = py(module, *argv)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and message in lines[0], (p.returncode, p.stderr)
    assert "Traceback" not in p.stderr


@pytest.mark.skipif(not os.path.exists("/usr/bin/python3"), reason="needs a system /usr/bin/python3 to stand for a bare Python")
def test_a_python_without_fairseq_under_qknorm_use_env_is_one_line_naming_the_fix(tmp_path):
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python").symlink_to("/usr/bin/python3")
    if subprocess.run([bare / "python", "-c", "import fairseq"], capture_output=True).returncode == 0:
        pytest.skip("/usr/bin/python3 has fairseq: it cannot stand for a Python without it")
    p = sh("train.sh", "demo", "qknorm", PATH=f"{bare}{os.pathsep}{os.environ['PATH']}", PYTHONPATH="")
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 1 and len(lines) == 1, (p.returncode, p.stderr)
    assert lines[0] == (f"[train] error: QKNORM_USE_ENV=1 but {bare}/python cannot import fairseq and sacrebleu: "
                        "install them, or unset QKNORM_USE_ENV to build .venv/"), lines[0]


def test_a_wrong_fairseq_flag_is_one_line_and_exit_2(tiny_data, tmp_path):
    import shutil

    shutil.copytree(tiny_data / "bin", tmp_path / "data-bin" / "demo")
    p = sh("train.sh", "demo", "postnorm", "--criterion", "nosuch", DATA_BIN=str(tmp_path / "data-bin"),
           CKPT_DIR=str(tmp_path / "ck"), LOG_DIR=str(tmp_path / "logs"))
    errors = [ln for ln in p.stderr.splitlines() if "error" in ln]
    assert p.returncode == 2 and len(errors) == 1, p.stderr
    assert errors[0].startswith("[train] error: fairseq-train refused demo/postnorm: argument --criterion: invalid choice: 'nosuch'")
    assert "Traceback" not in p.stderr


# ---- results are reused only when nothing changed ----

def test_fingerprint_covers_files_and_every_flag(tmp_path):
    from qknorm_pipeline.fingerprint import fingerprint

    ckpt = tmp_path / "checkpoint_best.pt"
    ckpt.write_bytes(b"weights")
    base = fingerprint([str(ckpt)], ["fairseq-generate", "--beam", "4"])
    assert base == fingerprint([str(ckpt)], ["fairseq-generate", "--beam", "4"])
    assert base != fingerprint([str(ckpt)], ["fairseq-generate", "--beam", "5"])
    assert base != fingerprint([str(ckpt)], ["fairseq-generate", "--beam", "4", "--decode-precision", "bf16"])
    ckpt.write_bytes(b"retrained")
    assert base != fingerprint([str(ckpt)], ["fairseq-generate", "--beam", "4"])


def test_evaluate_sh_decodes_again_when_a_decoding_flag_changes(tiny_pipeline):
    root = tiny_pipeline
    e = environment(root)
    run = lambda *extra: subprocess.run(["bash", os.path.join(REPO, "scripts", "evaluate.sh"), "demo", "postnorm",  # noqa: E731
                                         *extra], env=e, capture_output=True, text=True)
    log = os.path.join(root, "results", "demo", "postnorm", "generate.log")
    first = run("--beam", "3")
    assert first.returncode == 0, first.stderr[-3000:]
    assert "decoding demo/postnorm: 40 test sentences" in first.stderr and "'beam': 3" in open(log).read()
    assert re.search(r"demo/postnorm: decoded 40/40 sentences", first.stderr)
    same = run("--beam", "3")
    assert same.returncode == 0 and "already evaluated with this checkpoint and decoding command" in same.stderr
    assert "decoding demo/postnorm" not in same.stderr
    scores = os.path.join(root, "results", "demo", "postnorm", "scores.json")
    with open(scores, "r+") as f:  # cut short, as a full disk or a killed copy leaves it
        f.truncate(20)
    cut = run("--beam", "3")
    assert cut.returncode == 0 and "decoding demo/postnorm" in cut.stderr, cut.stderr
    assert "postnorm/scores.json: not valid JSON (" in cut.stderr and "it is decoded and scored again" in cut.stderr
    assert json.load(open(scores))["systems"]["postnorm"]["multi_bleu"] >= 0
    changed = run("--beam", "2")
    assert changed.returncode == 0 and "decoding demo/postnorm" in changed.stderr, changed.stderr
    assert "'beam': 2" in open(log).read() and json.load(open(scores))["decoding"][-2:] == ["--beam", "2"]
    # a mistyped flag: fairseq-generate refuses it, and the finished result stays whole and finished
    folder = os.path.dirname(log)
    before = {n: open(os.path.join(folder, n)).read() for n in ("scores.json", "hyp.txt", "generate.out", ".done")}
    bad = run("--beam", "abc")
    assert bad.returncode == 2 and "argument --beam: invalid int value: 'abc'" in bad.stderr, bad.stderr[-3000:]
    assert {n: open(os.path.join(folder, n)).read() for n in before} == before
    assert "invalid int value: 'abc'" in open(log).read()  # the log is the latest attempt's
    kept = run("--beam", "2")
    assert kept.returncode == 0 and "already evaluated with this checkpoint and decoding command" in kept.stderr


def test_evaluate_sh_refuses_a_checkpoint_cut_short_and_the_fix_it_names_works(tiny_pipeline):
    root = tiny_pipeline
    trained, cut = (root / "checkpoints" / "demo" / name for name in ("postnorm", "postnorm_seed2"))
    cut.mkdir()
    whole = (trained / "checkpoint_best.pt").read_bytes()
    (cut / "checkpoint_best.pt").write_bytes(whole[: len(whole) // 2])
    shutil.copy(trained / "checkpoint_last.pt", cut / "checkpoint_last.pt")
    run = lambda *words: subprocess.run(["bash", os.path.join(REPO, "scripts", "evaluate.sh"), *words],  # noqa: E731
                                        env=environment(root), capture_output=True, text=True)
    refused = run("demo", "postnorm_seed2")
    assert refused.returncode == 1 and refused.stderr.strip().splitlines() == [
        f"[evaluate] error: {cut}/checkpoint_best.pt is not a whole checkpoint (cut short?): decode "
        f"checkpoint_last.pt (--checkpoint last), or move {cut}/ away and train again (bash scripts/train.sh --seed 2 "
        "demo postnorm)"], refused.stderr
    assert not (root / "results" / "demo" / "postnorm_seed2").exists()
    last = run("--checkpoint", "last", "demo", "postnorm_seed2")
    assert last.returncode == 0, last.stderr[-3000:]
    assert len((root / "results" / "demo" / "postnorm_seed2" / "last" / "hyp.txt").read_text().splitlines()) == 40
    # a run trained without a checkpoint: the command that trains it
    missing = run("demo", "qknorm_seed3")
    assert missing.returncode == 1 and missing.stderr.strip().splitlines()[-1].endswith(
        "/checkpoints/demo/qknorm_seed3/checkpoint_best.pt: train first (bash scripts/train.sh --seed 3 demo qknorm)")


def test_evaluate_sh_refuses_fp16_decoding_on_a_cpu_in_one_line_before_the_model_loads(tiny_pipeline):
    """The plugin refuses it as the task is set up; evaluate shows that refusal as its one-line error."""
    result = tiny_pipeline / "results" / "demo" / "postnorm"
    before = {p: p.read_bytes() for p in result.rglob("*") if p.is_file() and p.name != "generate.log"}
    forced = subprocess.run(["bash", os.path.join(REPO, "scripts", "evaluate.sh"), "demo", "postnorm", "--decode-precision",
                             "bf16", "--cpu", "--decode-precision=fp16"],  # the last value wins, as in fairseq
                            env=environment(tiny_pipeline), capture_output=True, text=True)
    assert forced.returncode == 1 and forced.stderr.strip().splitlines()[-1] == (
        "[evaluate] error: fairseq-generate refused demo/postnorm: --decode-precision fp16 needs a CUDA device; decode in fp32 "
        f"(drop the flag) (full log: {result / 'generate.log'})"), forced.stderr
    assert "Traceback" not in forced.stderr and "Model file" not in (result / "generate.log").read_text()
    # nothing decoded, nothing lost; generate.log is the latest attempt's
    assert {p: p.read_bytes() for p in result.rglob("*") if p.is_file() and p.name != "generate.log"} == before


def test_compare_sh_refuses_a_result_trained_again_or_decoded_halfway_and_the_fixes_it_names_work(tiny_pipeline):
    root = tiny_pipeline
    again = root / "checkpoints" / "demo" / "again"
    again.mkdir()
    shutil.copy(root / "checkpoints" / "demo" / "prenorm" / "checkpoint_best.pt", again)
    run = lambda script, *words: subprocess.run(["bash", os.path.join(REPO, "scripts", script), *words],  # noqa: E731
                                                env=environment(root), capture_output=True, text=True)
    compare = lambda: run("compare.sh", "demo", "--runs", "again", "--n-samples", "20")  # noqa: E731
    fix = "evaluate again (bash scripts/evaluate.sh demo again)"
    assert run("evaluate.sh", "demo", "again").returncode == 0
    scores = json.load(open(root / "results" / "demo" / "again" / "scores.json"))
    assert scores["checkpoint"] == {"path": str(again / "checkpoint_best.pt"),
                                    "sha256": hashlib.sha256((again / "checkpoint_best.pt").read_bytes()).hexdigest()}
    assert scores["reference_sha256"] == hashlib.sha256((root / "data" / "demo" / "tok" / "test.tgt").read_bytes()).hexdigest()
    # trained again, not evaluated: refused, and the fix it names makes the table
    shutil.copy(root / "checkpoints" / "demo" / "postnorm" / "checkpoint_best.pt", again)
    stale = compare()
    assert stale.returncode == 1 and stale.stderr.strip().splitlines()[-1] == (
        f"[compare] error: demo/again: its scores are of an earlier {again}/checkpoint_best.pt (it has changed since "
        f"it was evaluated: trained again?): {fix}"), stale.stderr
    assert run("evaluate.sh", "demo", "again").returncode == 0 and compare().returncode == 0
    # a decoding again that fails leaves the finished result whole and finished: the table still has it
    result = root / "results" / "demo" / "again"
    before = {n: (result / n).read_text() for n in ("scores.json", "hyp.txt", ".done")}
    failed = run("evaluate.sh", "demo", "again", "--beam", "0")
    assert failed.returncode != 0 and {n: (result / n).read_text() for n in before} == before
    assert compare().returncode == 0
    # halfway (its .done gone, as a decoding killed while replacing the files leaves it): refused
    (result / ".done").unlink()
    halfway = compare()
    assert halfway.returncode == 1 and halfway.stderr.strip().splitlines()[-1].startswith(
        "[compare] error: unfinished evaluation of again in "), halfway.stderr
    assert halfway.stderr.strip().endswith(f"{fix} or leave it out (--runs)")
    (result / ".done").write_text(before[".done"])  # the shared tiny_pipeline as it was, for the tests after


# ---- shareable results ----

def test_committed_results_hold_no_machine_paths_or_host_name():
    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    assert files
    host = socket.gethostname().split(".")[0]
    machine = re.compile(r"(?<![\w.~-])/(home|work|tmp|Users|root|mnt|scratch|private|var/folders)/")
    found = []
    for name in files:
        data = open(os.path.join(REPO, name), "rb").read()
        if b"\0" in data[:4096]:  # PNG and other binary files
            continue
        # fairseq's own default (every train.log's config dump), not a path of the machine that wrote it
        text = data.decode("utf-8").replace("plasma_path': '/tmp/plasma'", "").replace("plasma_path='/tmp/plasma'", "")
        if machine.search(text) or REPO in text or re.search(rf"\b{re.escape(host)}\b", text):
            found.append(name)
    assert not found, f"machine paths or the host name {host!r} in {found}"



def test_code_map_names_every_module_and_script():
    # docs/code.md is how a newcomer finds the code of a step: it names every module and script
    # there is, and nothing that is not there
    text = open(os.path.join(REPO, "docs", "code.md"), encoding="utf-8").read()
    named = {n for n in re.findall(r"`([\w/]+\.(?:py|sh|sbatch))`", text)
             if not n.endswith("__init__.py") and not n.startswith("tests/")}
    tree = {os.path.relpath(f, REPO) for f in glob.glob(os.path.join(REPO, "qknorm_*", "**", "*.py"), recursive=True)}
    tree = {m for m in tree if not m.endswith("__init__.py")} | {os.path.relpath(f, REPO) for f in SCRIPTS}
    assert sorted(tree - named) == [] and sorted(named - tree) == []


def test_flags_after_a_double_dash_reach_fairseq_after_options_and_positionals(tmp_path):
    """`reproduce.sh PAIR --systems "a b" -- fairseq flags`: an option between the pair and `--` must
    not make argparse refuse the flags (what a user runs on a new corpus)."""
    from qknorm_pipeline import cli
    from qknorm_pipeline.reproduce import parser

    seen = {}
    assert cli.main(lambda a: seen.update(vars(a)), parser(),
                    ["ab-cd", "--systems", "postnorm", "--", "--max-update", "40", "--lr", "1e-3"]) == 0
    assert seen["pair_arg"] == "ab-cd" and seen["systems"] == "postnorm"
    assert seen["extra"] == ["--max-update", "40", "--lr", "1e-3"]
    p = sh("reproduce.sh", "nosuch", "--systems", "postnorm", "--", "--max-update", "40")
    assert p.returncode == 2 and "unknown pair 'nosuch'" in p.stderr  # parsed: the pair is what is wrong


# the pipeline's tools that never touch a model, and every entry point (which imports fairseq or torch
# only once it runs a model, so that --help and usage errors are instant)
NO_MODEL = ["scoring.bleu", "scoring.score", "scoring.compare", "scoring.significance", "recipes", "study.report",
            "data.download", "prepare", "progress", "files", "paths", "cli", "fairseq_log"]


def test_tools_that_never_touch_a_model_import_neither_fairseq_nor_torch():
    names = sorted({*NO_MODEL, *MODULES})
    code = (f"import sys; import {', '.join('qknorm_pipeline.' + m for m in names)}; "
            "print(sorted(m for m in ('fairseq', 'torch') if m in sys.modules))")
    p = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr
