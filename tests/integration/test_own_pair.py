"""The real TED az-en files (QKNORM_TEST_DATA) through prepare.sh and a short train.sh, with no
config written (tests/system runs a generated corpus to the BLEU table)."""
import json
import os

from helpers import REPO, TINY_RECIPE, environment, run, shared


def script(root, name, *args):
    return run(["bash", os.path.join(REPO, "scripts", name), *args], env=environment(root))


def test_real_ted_az_en_prepares_and_trains_without_a_config(tmp_path):
    corpus = shared("ted-az-en")
    script(tmp_path, "prepare.sh", "--pair", "az-en", "--src-dir", corpus, "--tokenized")
    stats = json.loads((tmp_path / "data-bin" / "az-en" / "stats.json").read_text())
    n_train = stats["lines"]["train"]["kept"]
    assert 5000 < n_train <= 5946 and stats["bpe"] == "fastbpe"
    p = script(tmp_path, "train.sh", "az-en", "postnorm", *TINY_RECIPE, "--max-update", "4",
               "--validate-interval-updates", "2", "--save-interval-updates", "2")
    # below 25k training pairs: gl->en's smaller model; one epoch per 100 pairs (recipes.size_from_data)
    assert f"sized for {n_train} training pairs: encoder_layers=4" in p.stderr
    assert f"epoch_updates={round(n_train / 100)}" in p.stderr
    assert (tmp_path / "checkpoints" / "az-en" / "postnorm" / "checkpoint_best.pt").exists()
