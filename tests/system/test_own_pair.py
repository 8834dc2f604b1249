"""A user's own corpus through the real scripts with no config written: prepare.sh --src-dir, then
reproduce.sh to the BLEU table (fastBPE and SentencePiece)."""
import json
import os
import shlex

import pytest

from qknorm_pipeline.data import demo as demo_corpus

from helpers import REPO, TINY_RECIPE, environment, run


def script(root, name, *args):
    return run(["bash", os.path.join(REPO, "scripts", name), *args], env=environment(root))


def write_corpus(folder, src, tgt, sizes=(("train", 300), ("dev", 30), ("test", 30))):
    folder.mkdir(parents=True)
    for split, pairs in demo_corpus.generate(7, sizes).items():
        (folder / f"{split}.{src}").write_text("".join(a + "\n" for a, _ in pairs))
        (folder / f"{split}.{tgt}").write_text("".join(b + "\n" for _, b in pairs))


@pytest.mark.parametrize("bpe, marks", [("fastbpe", ["@@"]), ("sentencepiece", ["\u2581", "@@"])])
def test_own_pair_from_src_dir_to_bleu_table(tmp_path, bpe, marks):
    pair, src, tgt = "ab-cd", "ab", "cd"
    write_corpus(tmp_path / "corpus", src, tgt)
    script(tmp_path, "prepare.sh", "--pair", pair, "--src-dir", str(tmp_path / "corpus"), "--raw",
           "--bpe", bpe, "--merges", "150")
    stats = json.loads((tmp_path / "data-bin" / pair / "stats.json").read_text())
    words = (tmp_path / "data-bin" / pair / f"dict.{tgt}.txt").read_text().split()
    assert stats["bpe"] == bpe and any(marks[0] in w for w in words)  # really segmented
    assert not (tmp_path / "configs").exists() and not os.path.exists(os.path.join(REPO, "configs", f"{pair}.yaml"))

    # training undoes the segmentation of stats.json for dev BLEU
    dry = script(tmp_path, "train.sh", "--dry-run", pair, "qknorm")
    args = shlex.split(dry.stdout)
    assert args[args.index("--eval-bleu-remove-bpe") + 1] == stats["remove_bpe"]
    assert f"sized for {stats['lines']['train']['kept']} training pairs" in dry.stderr

    run = script(tmp_path, "reproduce.sh", pair, "--systems", "postnorm qknorm", "--", *TINY_RECIPE,
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
