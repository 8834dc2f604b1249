"""The ablation report (scripts/ablate.sh's last step) on synthetic logs and score files laid out as
scripts/evaluate.sh writes them under RESULTS_DIR=RESULTS/SEARCH."""
import json

import pytest

from qknorm_pipeline import ablation
from qknorm_pipeline.fairseq_log import LogError


def _run(tmp_path, run, valid, bleu):
    log = tmp_path / "logs" / "demo" / run
    log.mkdir(parents=True)
    lines = [f'2026-01-01 00:00:00 | INFO | valid | {json.dumps({"valid_loss": "1.0", "valid_bleu": str(b), "valid_num_updates": str(u)})}'
             for u, b in valid]
    (log / "train.log").write_text("\n".join(lines) + "\n")
    for search, score in bleu.items():
        d = tmp_path / "results" / search / "demo" / run  # evaluate.sh: $RESULTS_DIR/PAIR/SYSTEM
        d.mkdir(parents=True)
        (d / "scores.json").write_text(json.dumps({"systems": {run: {"multi_bleu": score}}}))


def test_ablation_report_reads_every_run_and_search(tmp_path, capsys):
    _run(tmp_path, "qknorm", [(100, 40.0), (200, 80.5), (300, 79.0)], {"twt": 90.0, "fairseq": 89.5})
    _run(tmp_path, "qknorm_nobias", [(100, 38.0), (200, 70.0)], {"twt": 85.25, "fairseq": 86.0})
    rows = {run: {"what": what, **ablation.run_row(str(tmp_path / "logs" / "demo" / run / "train.log"),
                                                   str(tmp_path / "results"), "demo", run)}
            for run, what in (("qknorm", "none"), ("qknorm_nobias", "--no-output-bias"))}
    assert rows["qknorm"]["stopped_at"] == 300 and rows["qknorm"]["best_dev_bleu"] == 80.5
    assert rows["qknorm_nobias"]["test_fairseq"] == 86.0
    ablation.write_report("demo", "qknorm", rows, "Command: x", str(tmp_path / "abl"))
    md = (tmp_path / "abl.md").read_text()
    assert "| qknorm_nobias | --no-output-bias | 200 | 70.00 | 85.25 | 86.00 | -4.75 |" in md
    assert md in capsys.readouterr().out
    assert json.loads((tmp_path / "abl.json").read_text())["runs"]["qknorm"]["test_twt"] == 90.0


def test_ablation_report_names_a_missing_decoding(tmp_path):
    _run(tmp_path, "qknorm", [(100, 40.0)], {"twt": 90.0})
    with pytest.raises(LogError, match="evaluate qknorm with --beam-search fairseq"):
        ablation.run_row(str(tmp_path / "logs" / "demo" / "qknorm" / "train.log"), str(tmp_path / "results"),
                         "demo", "qknorm")


def test_the_alternative_stopping_rule_is_the_other_procedure():
    assert ablation.alternative("twt_paper") == "twt_code"
    assert ablation.alternative("twt_code") == ablation.alternative("qknorm") == "twt_paper"
