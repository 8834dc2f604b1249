"""A user's own corpus through the real scripts with no config written: prepare.sh --src-dir, then
reproduce.sh to the BLEU table (fastBPE and SentencePiece), and the real TED az-en files of
../shared/data through prepare.sh and a short train.sh."""
import json
import os
import shlex
import subprocess

import pytest

from helpers import REPO, SHARED_DATA as SHARED, pipeline_env
from qknorm_pipeline.data import demo as demo_corpus

# fairseq flags after PAIR SYSTEM win over the recipe: a tiny model and a few updates
TINY = ["--encoder-embed-dim", "32", "--decoder-embed-dim", "32", "--encoder-ffn-embed-dim", "64",
        "--decoder-ffn-embed-dim", "64", "--encoder-layers", "1", "--decoder-layers", "1",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2", "--max-tokens", "1000",
        "--lr", "0.005", "--warmup-updates", "10", "--num-workers", "0", "--log-interval", "5",
        "--eval-bleu-args", '{"beam": 2, "max_len_a": 1, "max_len_b": 5}']


def script(root, name, *args):
    p = subprocess.run(["bash", os.path.join(REPO, "scripts", name), *args], env=pipeline_env(str(root)),
                       capture_output=True, text=True)
    assert p.returncode == 0, f"{name} {args} failed:\n{p.stdout[-2000:]}\n{p.stderr[-4000:]}"
    return p


def write_corpus(folder, src, tgt, sizes=(("train", 300), ("dev", 30), ("test", 30))):
    folder.mkdir(parents=True)
    for split, pairs in demo_corpus.generate(7, sizes).items():
        (folder / f"{split}.{src}").write_text("".join(a + "\n" for a, _ in pairs))
        (folder / f"{split}.{tgt}").write_text("".join(b + "\n" for _, b in pairs))


@pytest.mark.system
@pytest.mark.parametrize("bpe, marks", [("fastbpe", ["@@"]), ("sentencepiece", ["\u2581", "@@"])])
def test_own_pair_from_src_dir_to_bleu_table(tmp_path, bpe, marks):
    pair, src, tgt = "ab-cd", "ab", "cd"
    write_corpus(tmp_path / "corpus", src, tgt)
    script(tmp_path, "prepare.sh", "--pair", pair, "--src-dir", str(tmp_path / "corpus"), "--raw",
           "--bpe", bpe, "--merges", "150")
    stats = json.loads((tmp_path / "data-bin" / pair / "stats.json").read_text())
    assert stats["bpe"] == bpe and any(marks[0] in t for t in stats["target_vocab"])  # really segmented
    assert not (tmp_path / "configs").exists() and not os.path.exists(os.path.join(REPO, "configs", f"{pair}.yaml"))

    # training undoes the segmentation of stats.json for dev BLEU
    dry = script(tmp_path, "train.sh", "--dry-run", pair, "qknorm")
    args = shlex.split(dry.stdout)
    assert args[args.index("--eval-bleu-remove-bpe") + 1] == stats["remove_bpe"]
    assert f"sized for {stats['lines']['train']['kept']} training pairs" in dry.stderr

    run = script(tmp_path, "reproduce.sh", pair, "--systems", "postnorm qknorm", "--", *TINY,
                 "--max-update", "20", "--validate-interval-updates", "10", "--save-interval-updates", "10")
    assert "your own corpus" in run.stderr and "| qknorm |" in run.stdout
    table = json.loads((tmp_path / "results" / pair / "compare.json").read_text())
    assert {r["system"] for r in table["rows"]} == {"postnorm", "qknorm"} and table["baseline"] == "postnorm"
    ref = (tmp_path / "data" / pair / "tok" / f"test.{tgt}").read_text().splitlines()
    for system in ("postnorm", "qknorm"):
        hyp = (tmp_path / "results" / pair / system / "hyp.txt").read_text(encoding="utf-8").splitlines()
        assert len(hyp) == len(ref) == 30
        assert not [h for h in hyp if any(m in h for m in marks)], f"{system}: segmentation left in hypotheses"
        assert sum(len(h.split()) for h in hyp) > 0
        log = (tmp_path / "logs" / pair / system / "train.log").read_text()
        assert '"valid_bleu"' in log


@pytest.mark.integration
@pytest.mark.skipif(not os.path.isdir(os.path.join(SHARED, "ted-az-en")),
                    reason="../shared/data/ted-az-en is absent (real TED data is only on development machines)")
def test_shared_ted_az_en_prepares_and_trains_without_a_config(tmp_path):
    script(tmp_path, "prepare.sh", "--pair", "az-en", "--src-dir", os.path.join(SHARED, "ted-az-en"), "--tokenized")
    stats = json.loads((tmp_path / "data-bin" / "az-en" / "stats.json").read_text())
    n_train = stats["lines"]["train"]["kept"]
    assert 5000 < n_train <= 5946 and stats["bpe"] == "fastbpe"
    p = script(tmp_path, "train.sh", "az-en", "postnorm", *TINY, "--max-update", "4",
               "--validate-interval-updates", "2", "--save-interval-updates", "2")
    # below 25k training pairs: gl->en's smaller model; one epoch per 100 pairs (recipes.size_from_data)
    assert f"sized for {n_train} training pairs: encoder_layers=4" in p.stderr
    assert f"epoch_updates={round(n_train / 100)}" in p.stderr
    assert (tmp_path / "checkpoints" / "az-en" / "postnorm" / "checkpoint_best.pt").exists()
