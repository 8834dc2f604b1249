"""The fingerprint of a result covers the code that decodes and scores, found by listing the packages."""
import glob
import os
import shutil
import zipfile

import pytest

from qknorm_pipeline import evaluate, fingerprint, processes
from qknorm_pipeline.paths import Folders

from helpers import REPO


@pytest.fixture
def repo_copy(tmp_path):
    """The plugin and the pipeline copied to a folder of their own, to be edited."""
    for package in ("qknorm_fairseq", "qknorm_pipeline"):
        shutil.copytree(os.path.join(REPO, package), tmp_path / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_code_files_are_every_module_of_the_plugin_and_the_scorer_and_what_the_scorer_imports():
    listed = {os.path.relpath(p, REPO) for d in ("qknorm_fairseq", "qknorm_pipeline/scoring")
              for p in glob.glob(os.path.join(REPO, d, "**", "*.py"), recursive=True)}
    code = fingerprint.code_files()
    assert listed <= set(code)
    assert {"qknorm_fairseq/positions.py", "qknorm_fairseq/config.py", "qknorm_pipeline/files.py"} <= set(code)
    # nothing that neither decodes nor scores: training, plots, the study and downloads are not imported by the scorer
    assert not {"qknorm_pipeline/train.py", "qknorm_pipeline/plots.py", "qknorm_pipeline/evaluate.py",
                "qknorm_pipeline/data/fetch.py", "qknorm_pipeline/fingerprint.py"} & set(code)


@pytest.mark.parametrize("module", ["qknorm_fairseq/positions.py", "qknorm_fairseq/config.py",
                                    "qknorm_pipeline/files.py", "qknorm_pipeline/scoring/bleu.py"])
def test_an_edit_of_any_decoding_or_scoring_module_changes_the_fingerprint(repo_copy, module):
    before = fingerprint.fingerprint([], ["fairseq-generate"], root=repo_copy)
    assert before == fingerprint.fingerprint([], ["fairseq-generate"], root=repo_copy)
    with open(repo_copy / module, "a") as f:
        f.write("# edited\n")
    assert fingerprint.fingerprint([], ["fairseq-generate"], root=repo_copy) != before


def test_an_edit_elsewhere_keeps_the_fingerprint(repo_copy):
    before = fingerprint.fingerprint([], ["fairseq-generate"], root=repo_copy)
    with open(repo_copy / "qknorm_pipeline" / "plots.py", "a") as f:
        f.write("# edited\n")
    assert fingerprint.fingerprint([], ["fairseq-generate"], root=repo_copy) == before


def test_evaluate_decodes_again_after_an_edit_of_positions_py(tmp_path, repo_copy, monkeypatch, tiny_data):
    """evaluate() with fairseq-generate replaced by a stub that writes the reference as hypotheses."""
    where = Folders(*(str(tmp_path / d) for d in ("data", "data-bin", "ckpt", "logs", "results")))
    shutil.copytree(tiny_data / "bin", os.path.join(where.data_bin, "demo"))
    os.makedirs(os.path.join(where.data, "demo", "tok"))
    ref = os.path.join(where.data, "demo", "tok", "test.tgt")
    shutil.copy(tiny_data / "raw" / "test.tgt", ref)
    os.makedirs(os.path.join(where.ckpt, "demo", "sys"))
    with zipfile.ZipFile(os.path.join(where.ckpt, "demo", "sys", "checkpoint_best.pt"), "w") as z:
        z.writestr("weights", "0")  # a whole checkpoint for evaluate's check; never loaded here
    decoded = []

    def decode(name, cmd, out, log, n, env=None):
        decoded.append(name)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with open(ref) as f_ref, open(out, "w") as f_out:
            for i, line in enumerate(f_ref):
                f_out.write(f"H-{i}\t-0.1\t{line}")

    monkeypatch.setattr(processes, "decode", decode)
    monkeypatch.setattr(fingerprint, "ROOT", str(repo_copy))
    assert evaluate.evaluate("demo", "sys", where=where)["systems"]["sys"]["multi_bleu"] == pytest.approx(100)
    evaluate.evaluate("demo", "sys", where=where)
    assert decoded == ["demo/sys"]
    with open(repo_copy / "qknorm_fairseq" / "positions.py", "a") as f:
        f.write("# edited\n")
    evaluate.evaluate("demo", "sys", where=where)
    assert decoded == ["demo/sys", "demo/sys"]
