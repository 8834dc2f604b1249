"""The GPU-facing pieces that run anywhere: the precision report and the training entry point's
fixes to fairseq's arguments (tests/integration/test_fairseq_cli.py: decoding precision on a CPU)."""
import argparse
import json
import shlex

import pytest

from qknorm_pipeline import precision_check
from qknorm_pipeline.fairseq_train import fix_args


def _log(path, losses):
    path.mkdir(parents=True)
    lines = ["# 2026-01-01T00:00:00Z fairseq-train ..."]
    for update, loss in losses.items():
        rec = {"epoch": 1, "loss": str(loss), "num_updates": str(update)}
        lines.append(f"2026-01-01 00:00:00 | INFO | train_inner | {json.dumps(rec)}")
        lines.append(f"2026-01-01 00:00:00 | INFO | train_inner | {json.dumps(rec)}")  # fairseq's duplicate
    (path / "train.log").write_text("\n".join(lines) + "\n")


def test_precision_report_compares_every_logged_update_with_fp32(tmp_path):
    _log(tmp_path / "qknorm_fp32", {10: 8.0, 20: 6.0, 30: 5.0})
    _log(tmp_path / "qknorm_bf16", {10: 8.1, 20: 6.3, 30: 5.0})  # 1.25%, 5%, 0%
    _log(tmp_path / "qknorm_fp16", {10: 8.0, 20: float("nan"), 30: 5.0})
    ok = precision_check.report(str(tmp_path), ["qknorm"], "settings", str(tmp_path / "report"), tolerance=0.04)
    res = json.loads((tmp_path / "report.json").read_text())["results"]["qknorm"]
    assert res["bf16"]["max_rel_diff"] == pytest.approx(0.05)
    assert res["bf16"]["mean_rel_diff"] == pytest.approx((0.0125 + 0.05) / 3)
    assert res["bf16"]["finite"] and not res["bf16"]["passed"]  # 5% > 4%
    assert not res["fp16"]["finite"] and not res["fp16"]["passed"]
    assert not ok
    assert "| qknorm | bf16 | 3 | 5.000 (5.000) | 0.0500 | 0.0208 | yes | NO |" in (tmp_path / "report.md").read_text()


def test_precision_report_names_a_missing_run(tmp_path):
    _log(tmp_path / "postnorm_fp32", {10: 8.0})
    assert not precision_check.report(str(tmp_path), ["postnorm"], "settings", str(tmp_path / "r"))
    assert "postnorm bf16: train log" in (tmp_path / "r.md").read_text()


def test_a_failed_precision_does_not_hide_the_other(tmp_path):
    _log(tmp_path / "qknorm_fp32", {10: 8.0, 20: 6.0})
    _log(tmp_path / "qknorm_bf16", {10: 8.0, 20: 6.06})
    (tmp_path / "qknorm_fp16").mkdir()  # the run died before its first logged update
    assert not precision_check.report(str(tmp_path), ["qknorm"], "settings", str(tmp_path / "r"))
    report = (tmp_path / "r.md").read_text()
    assert "| qknorm | bf16 | 2 | 6.060 (6.000) | 0.0100 | 0.0050 | yes | yes |" in report
    assert "- missing: qknorm fp16: " in report


def test_a_report_of_runs_never_made_keeps_the_report_there(tmp_path):
    (tmp_path / "r.md").write_text("the last check\n")
    with pytest.raises(precision_check.UserError, match=r"^no train.log of qknorm in .*: run the check without "
                                                        r"--report-only first$"):
        precision_check.report(str(tmp_path / "logs"), ["qknorm"], "settings", str(tmp_path / "r"))
    assert (tmp_path / "r.md").read_text() == "the last check\n" and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("argv,message", [
    (["--report-only", "--pair", "demo", "--systems", "qknorm nosuch"],
     "--systems: nosuch not among demo's systems (postnorm prenorm fixnorm "),
    (["--report-only", "--tolerance", "-1"], "--tolerance must be a positive number, got -1.0")])
def test_precision_check_usage_errors(argv, message, capsys):
    assert precision_check.main(argv) == 2
    assert capsys.readouterr().err.startswith(f"[precision_check] error: {message}")


def ns(**kw):
    base = dict(bf16=False, tpu=False, cpu=False, ddp_backend="pytorch_ddp", distributed_world_size=1)
    return argparse.Namespace(**{**base, **kw})


def test_bf16_is_untied_from_tpu_without_torch_xla():
    # what fairseq's options.parse_args_and_arch makes of --bf16
    assert fix_args(ns(bf16=True, tpu=True), ["--bf16"]).tpu is False
    assert fix_args(ns(bf16=True, tpu=True), ["--bf16", "--tpu"]).tpu is True  # asked for explicitly


def test_cpu_bf16_without_native_instructions_is_an_error(monkeypatch):
    from qknorm_pipeline import fairseq_train

    monkeypatch.setattr(fairseq_train.hardware, "cpu_has_bf16", lambda: False)
    with pytest.raises(SystemExit, match=r"^\[fairseq_train\] error: --cpu --bf16: this CPU has no native bf16 .*"
                                         "drop --bf16$"):
        fix_args(ns(bf16=True, tpu=True, cpu=True), ["--cpu", "--bf16"])
    assert fix_args(ns(bf16=True, tpu=True), ["--bf16"]).bf16  # on a GPU
    assert not fix_args(ns(cpu=True), ["--cpu"]).bf16
    monkeypatch.setattr(fairseq_train.hardware, "cpu_has_bf16", lambda: True)
    assert fix_args(ns(bf16=True, tpu=True, cpu=True), ["--cpu", "--bf16"]).tpu is False


def test_cpu_ranks_get_legacy_ddp_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert fix_args(ns(cpu=True, distributed_world_size=2), []).ddp_backend == "legacy_ddp"
    assert fix_args(ns(cpu=True), []).ddp_backend == "pytorch_ddp"  # one process: nothing to wrap
    assert fix_args(ns(distributed_world_size=2), []).ddp_backend == "pytorch_ddp"  # GPUs: fairseq's default
    given = ["--ddp-backend", "pytorch_ddp"]
    assert fix_args(ns(cpu=True, distributed_world_size=2), given).ddp_backend == "pytorch_ddp"
    monkeypatch.setenv("WORLD_SIZE", "4")  # torchrun's
    assert fix_args(ns(cpu=True), []).ddp_backend == "legacy_ddp"


@pytest.mark.parametrize("argv", [[], ["--pair", "en-vi", "--updates", "50", "--jobs", "14", "--systems", "postnorm qknorm",
                                       "--tolerance", "0.0123456789", "--report-only"]])
def test_the_reports_command_asks_for_what_was_checked(argv):
    parser = precision_check.parser()
    asked = parser.parse_args(argv)
    line = precision_check.command_line(asked)
    words = shlex.split(line)
    assert words[:2] == ["bash", "scripts/precision_check.sh"]
    again = parser.parse_args(words[2:])
    assert vars(again) == dict(vars(asked), report_only=False)
