"""qknorm_pipeline/study/records.py: a run's record is written whole or not at all."""
import os
import sysconfig

import pytest

from qknorm_pipeline import paths
from qknorm_pipeline.paths import ROOT
from qknorm_pipeline.study.records import write_record


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
