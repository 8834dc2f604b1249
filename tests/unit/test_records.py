"""qknorm_pipeline/study/records.py: a run's record is written whole or not at all, and the report
reads each run's test scores from it."""
import os
import random
import sysconfig

import pytest

from qknorm_pipeline import paths
from qknorm_pipeline.paths import ROOT
from qknorm_pipeline.scoring.bleu import multi_bleu_detok
from qknorm_pipeline.study import config, records
from qknorm_pipeline.study.config import StudyError
from qknorm_pipeline.study.records import write_record

from helpers import log_line, naive_bleu, write_train_log


def test_a_record_is_written_whole_or_not_at_all(tmp_path):
    runs = tmp_path / "runs"
    rec = runs / "gl-en" / "qknorm"
    log = tmp_path / "train.log"
    # a traceback in the log names the repository's files and the Python installation's (stdlib frames)
    stdlib = sysconfig.get_path("stdlib")
    log.write_text(f"# 2026-01-01T12:00:00Z python {ROOT}{os.sep}x.py\n"
                   f'  File "{stdlib}{os.sep}contextlib.py", line 81, in inner\n')
    best = tmp_path / "best"
    best.mkdir()
    (best / "hyp.txt").write_text("a\n")
    (best / "scores.json").write_text("{}\n")
    write_record(str(rec), str(log), str(best), None, "train: x")
    assert sorted(os.listdir(rec)) == ["command.txt", "hyp.txt", "scores.json", "train.log"]
    assert (rec / "train.log").read_text() == (  # no machine path
        "# 2026-01-01T12:00:00Z python x.py\n"
        f'  File "$STDLIB{os.sep}contextlib.py", line 81, in inner\n')
    assert (rec / "command.txt").read_text() == "train: x\n"
    with pytest.raises(FileNotFoundError):
        write_record(str(rec), str(tmp_path / "missing.log"), str(best), None, "train: y")
    assert (rec / "command.txt").read_text() == "train: x\n"  # the old record, untouched
    assert os.listdir(runs) == ["gl-en"] and os.listdir(runs / "gl-en") == ["qknorm"]  # no temporary left


def test_a_log_names_installed_packages_and_the_home_folder_without_this_machine(monkeypatch):
    # a system Python: site-packages inside the stdlib's folder, so the longer prefix must win
    layout = {"stdlib": "/usr/lib/python3.11", "purelib": "/usr/lib/python3.11/site-packages",
              "platlib": "/opt/venv/lib/python3.11/site-packages"}
    monkeypatch.setattr(paths.sysconfig, "get_path", layout.__getitem__)
    monkeypatch.setenv("HOME", "/home/ann")
    log = (f"python {ROOT}/x.py\n"
           '  File "/usr/lib/python3.11/site-packages/fairseq/trainer.py", line 1\n'
           '  File "/opt/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 2\n'
           '  File "/usr/lib/python3.11/contextlib.py", line 3\n'
           "checkpoints in /home/ann/ckpt/\n")
    assert paths.shareable_text(log) == (
        "python x.py\n"
        '  File "$SITE/fairseq/trainer.py", line 1\n'
        '  File "$SITE/torch/nn/modules/module.py", line 2\n'
        '  File "$STDLIB/contextlib.py", line 3\n'
        "checkpoints in ~/ckpt/\n")


def test_collect_scores_the_best_dev_and_the_last_checkpoint(tmp_path):
    """Each run's test scores from its record: the best-dev checkpoint's hyp.txt, and the last
    checkpoint's last/hyp.txt where it was decoded; without it, the best one where the last
    validation was (tied with) the best, since fairseq then saved that checkpoint as best too."""
    cfg = config.load(os.path.join(ROOT, "configs", "studies", "gl-en.yaml"))
    rng = random.Random(2)
    refs = [" ".join(f"w{rng.randrange(30)}" for _ in range(12)) for _ in range(40)]
    ref = tmp_path / "test.en"
    ref.write_text("".join(r + "\n" for r in refs))

    def noisy(p):
        return [" ".join(w if rng.random() > p else "x" for w in r.split()) for r in refs]

    hyps = {}
    for name, bleus, last in (("postnorm", [1.0, 2.0], None), ("prenorm", [3.0, 1.0], 0.1), ("qknorm", [3.0, 1.0], None)):
        d = tmp_path / "runs" / name
        write_train_log(d / "train.log", [log_line("valid", {"valid_loss": 5, "valid_bleu": b, "valid_num_updates": 10 * k},
                                                   f"12:00:{k:02d}") for k, b in enumerate(bleus, 1)])
        for key, out, p in ((name, d, 0.3), *(((f"{name}/last", d / "last", last),) if last else ())):
            out.mkdir(exist_ok=True)
            hyps[key] = noisy(p)
            (out / "hyp.txt").write_text("".join(h + "\n" for h in hyps[key]))
        (d / "command.txt").write_text("train: x\n")
    chosen = config.runs(cfg, ["postnorm", "prenorm", "qknorm"], seeds=1, multipliers=False)
    found = records.collect(chosen, str(tmp_path / "runs"), str(ref), config.recipe(cfg, str(tmp_path / "no-data-bin")))
    detok = {k: multi_bleu_detok(h, [refs]).score for k, h in hyps.items()}  # these words: detokenizing changes none
    for name in ("postnorm", "prenorm", "qknorm"):
        assert found[name]["test"]["multi_bleu"] == pytest.approx(naive_bleu(hyps[name], refs), abs=1e-3)
        assert found[name]["test"]["multi_bleu_detok"] == pytest.approx(detok[name], abs=1e-3)
    assert (found["postnorm"]["last"], found["postnorm"]["last_source"]) == (found["postnorm"]["test"]["multi_bleu_detok"], "best")
    assert found["prenorm"]["last"] == pytest.approx(detok["prenorm/last"], abs=1e-3) and found["prenorm"]["last_source"] == "decoded"
    assert (found["qknorm"]["last"], found["qknorm"]["last_source"]) == (None, None)
    # a run without a finished record is named, with what to do
    (tmp_path / "runs" / "qknorm" / "command.txt").unlink()
    with pytest.raises(StudyError, match="no record of qknorm in .*: finish them first"):
        records.collect(chosen, str(tmp_path / "runs"), str(ref), config.recipe(cfg))


def test_the_machine_a_training_logs_is_read_back_whole(monkeypatch, tmp_path):
    """hardware.machine() as the training entry point logs it at each start (fairseq_train), and
    read_run's reading of it: the same string, one per segment; the CPU's name from /proc/cpuinfo."""
    from qknorm_pipeline import fairseq_train, hardware

    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ["processor\t: 0", "model name\t: AMD EPYC 9B14 96-Core Processor",
                                                        "flags\t\t: fpu avx2 avx512f avx512_bf16"])
    assert hardware.cpu_name() == "AMD EPYC 9B14 96-Core Processor" and hardware.cpu_has_bf16()
    assert hardware.device_name(gpu=False) == f"AMD EPYC 9B14 96-Core Processor ({os.cpu_count()} cores)"
    line = hardware.machine()
    assert line.startswith(f"AMD EPYC 9B14 96-Core Processor, {os.cpu_count()} CPUs, ") and line.endswith(" kernels")
    log = write_train_log(tmp_path / "train.log", [
        f"2026-01-01 12:00:01 | INFO | {fairseq_train.logger.name} | {fairseq_train.MACHINE}{line}\n",
        log_line("valid", {"valid_loss": 5, "valid_bleu": 1.0, "valid_num_updates": 10}, "12:00:02")])
    assert records.read_run(str(log))["machines"] == [line]
    monkeypatch.setattr(hardware, "_cpuinfo", lambda: ["flags\t\t: fpu avx2 avx512f"])
    assert not hardware.cpu_has_bf16()
