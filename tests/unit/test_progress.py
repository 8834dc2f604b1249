"""qknorm_pipeline/progress.py: the live progress display fed a run's output, as processes.py feeds it."""
import io
import json
import re
import time
from types import SimpleNamespace

import pytest

from qknorm_pipeline import progress


def _record(kind, **fields):
    return f"2026-01-01 00:00:00 | INFO | {kind} | " + json.dumps({k: str(v) for k, v in fields.items()})


FAKE_TRAIN = ["2026-01-01 00:00:00 | INFO | fairseq_cli.train | {'_name': None}",
              _record("train_inner", epoch=1, loss=5.5, lr=1e-4, ups=3.0, num_updates=10),
              _record("train_inner", epoch=1, loss=4.5, lr=2e-4, ups=3.0, num_updates=20),
              _record("valid", epoch=1, valid_loss=4.0, valid_bleu=12.5, valid_best_bleu=12.5, valid_num_updates=20),
              "2026-01-01 00:00:00 | WARNING | qknorm_fairseq.lr_scheduler | our own warning stays visible",
              _record("train_inner", epoch=2, loss=3.5, lr=3e-4, ups=3.0, num_updates=30),
              _record("valid", epoch=2, valid_loss=3.0, valid_bleu=10.0, valid_best_bleu=12.5, valid_num_updates=30)]


@pytest.fixture(autouse=True)
def not_a_terminal(monkeypatch):
    monkeypatch.delenv("VERBOSE", raising=False)
    monkeypatch.delenv("QKNORM_PROGRESS", raising=False)


def stream(text):
    return io.BytesIO(text.encode())


def test_training_progress_plain_lines_without_a_terminal(tmp_path, capsys):
    log = tmp_path / "train.log"
    log.write_text("# the command\n")
    text = "\n".join(FAKE_TRAIN) + "\n"
    progress.follow_training(stream(text), str(log), "demo/qknorm", max_update=40)
    out, err = capsys.readouterr()
    assert out == "" and log.read_text() == "# the command\n" + text  # the whole fairseq output is kept, appended
    lines = err.splitlines()
    assert "\r" not in err and len(lines) == 4, lines
    assert "our own warning stays visible" in lines[1]
    assert re.search(r"^\[train \d\d:\d\d:\d\d\] demo/qknorm 20/40 updates  loss 4\.500  dev BLEU 12\.50  "
                     r"lr 2\.00e-04  [\d.]+ upd/s  ETA \d+:\d\d$", lines[0]), lines[0]
    assert "demo/qknorm 30/40 updates  loss 3.500  dev BLEU 10.00" in lines[2]
    # no "begin validation" lines in this output: the validations' time is not known, so not stated
    assert re.search(r"demo/qknorm: 30 updates in \d+:\d\d, loss 3\.500, best dev BLEU 12\.50 \(update 20\)$",
                     lines[3]), lines[3]


def test_the_summary_says_where_the_time_went(tmp_path, capsys, monkeypatch):
    """Start-up to fairseq's first epoch, each validation from its first line to its record, and the seconds
    fairseq says each checkpoint took to write, on a clock that moves only as the lines arrive."""
    clock = [100.0]
    monkeypatch.setattr(progress, "time", SimpleNamespace(monotonic=lambda: clock[0], strftime=time.strftime))
    saved = "2026-01-01 00:00:00 | INFO | fairseq.checkpoint_utils | Saved checkpoint ckpt/checkpoint_1_{}.pt " \
            "(epoch 1 @ {} updates, score 1.0) (writing took {} seconds)"
    began = '2026-01-01 00:00:00 | INFO | fairseq_cli.train | begin validation on "valid" subset'
    timed = [(0, "2026-01-01 00:00:00 | INFO | fairseq.trainer | begin training epoch 1"),  # 5 s after the start
             (20, _record("train_inner", loss=4.0, lr=1e-4, ups=1.0, num_updates=20)), (0, began),
             (12, _record("valid", valid_loss=4.0, valid_bleu=1.0, valid_best_bleu=1.0, valid_num_updates=20)),
             (2, saved.format(20, 20, 1.5)),
             (20, _record("train_inner", loss=3.0, lr=1e-4, ups=1.0, num_updates=40)), (0, began),
             (10, _record("valid", valid_loss=3.0, valid_bleu=2.0, valid_best_bleu=2.0, valid_num_updates=40)),
             (3, saved.format(40, 40, 2.25))]

    def lines():
        clock[0] += 5
        for seconds, line in timed:
            clock[0] += seconds
            yield (line + "\n").encode()

    progress.follow_training(lines(), str(tmp_path / "t.log"), "gl-en/qknorm", max_update=40)
    last = capsys.readouterr().err.splitlines()[-1]
    assert last.endswith("gl-en/qknorm: 40 updates in 1:12, loss 3.000, best dev BLEU 2.00 (update 40); "
                         "of that, start-up 0:05, 2 validations 0:22, checkpoint writing 0:04"), last


def test_python_warnings_counted_in_one_line_for_a_program_we_do_not_control(tmp_path, capsys):
    warnings = ["/venv/hydra/experimental/initialize.py:43: UserWarning: hydra.experimental.initialize() is old",
                "  warnings.warn(",
                "sys:1: UserWarning: ",
                "/venv/fairseq/tasks/fairseq_task.py:531: FutureWarning: `torch.cuda.amp.autocast(args...)` is deprecated"]
    text = "\n".join(FAKE_TRAIN[:1] + warnings + FAKE_TRAIN[1:]) + "\n"
    log = tmp_path / "t.log"
    progress.follow_training(stream(text), str(log), "gl-en/stock", max_update=40)
    assert capsys.readouterr().err.count("Warning: ") == 3
    progress.follow_training(stream(text), str(log), "gl-en/stock", max_update=40, python_warnings="count")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert "Warning: " not in err, err
    assert re.search(r"^\[train [\d:]+\] 3 Python warnings from the run's libraries, not shown; full text in "
                     + re.escape(str(log)) + "$", lines[0]), lines
    assert "gl-en/stock 20/40 updates" in lines[1] and "our own warning stays visible" in lines[2]
    assert log.read_text() == text * 2  # both runs appended every line
    # a run that stops before its first record still says how many it hid
    progress.follow_training(stream(warnings[0] + "\n"), str(log), "x", python_warnings="count")
    assert "1 Python warning from the run's libraries" in capsys.readouterr().err


def test_periodic_lines_do_not_repeat_a_validation_line(tmp_path, capsys):
    records = []
    for u in range(10, 61, 10):
        records.append(_record("train_inner", loss=1.0, lr=1e-3, ups=1.0, num_updates=u))
        records.append("2026-01-01 00:00:00 | INFO | fairseq.trainer | begin training epoch 2")  # no line
        if u % 20 == 0:
            records.append(_record("valid", valid_loss=1.0, valid_bleu=u, valid_best_bleu=u, valid_num_updates=u))
    progress.follow_training(stream("\n".join(records) + "\n"), str(tmp_path / "t.log"), "train", max_update=60,
                             every=0)
    err = capsys.readouterr().err
    # every record is due a line (every=0), but once the validation interval (20) is known, the
    # train_inner record of a validation's update leaves the line to the validation
    assert re.findall(r"train (\d+)/60 updates", err) == ["10", "20", "20", "30", "40", "50", "60"], err


def test_training_progress_bar_on_a_terminal_and_verbose_echo(tmp_path, capsys, monkeypatch):
    text = "\n".join(FAKE_TRAIN) + "\n"
    monkeypatch.setenv("QKNORM_PROGRESS", "bar")
    progress.follow_training(stream(text), str(tmp_path / "a.log"), "x", max_update=40)
    drawn = capsys.readouterr().err
    assert "\r" in drawn and "x 30/40 updates |" in drawn, drawn
    assert "loss 3.500  dev BLEU 10.00  lr 3.00e-04" in drawn
    monkeypatch.setenv("VERBOSE", "1")
    progress.follow_training(stream(text), str(tmp_path / "b.log"), "x", max_update=40)
    echoed = capsys.readouterr().err
    assert all(line in echoed for line in FAKE_TRAIN)


def test_decoding_progress_counts_sentences(tmp_path, capsys):
    out = tmp_path / "generate.out"
    text = "".join(f"S-{i}\tsrc\nT-{i}\tref\nH-{i}\t-0.1\thyp\n" for i in range(5)) + "Generate test with beam=4\n"
    progress.follow_decoding(stream(text), str(out), "demo/qknorm", 5, every=0)
    assert out.read_text() == text
    lines = capsys.readouterr().err.splitlines()
    assert [ln.split("] ", 1)[1] for ln in lines[:5]] == [f"demo/qknorm {i}/5 sentences decoded" for i in range(1, 6)]
    assert re.search(r"^\[evaluate [\d:]+\] demo/qknorm: decoded 5/5 sentences in", lines[5])
