"""fairseq-train and fairseq-generate with GNMT length normalisation (qknorm_fairseq/task.py)."""
import collections
import os

import pytest

from helpers import BIN, USER_DIR, run, train_cmd


def _hypotheses(stdout):
    out = collections.defaultdict(list)
    for line in stdout.splitlines():
        if line.startswith("H-"):
            tag, score, text = line.split("\t")
            out[int(tag[2:])].append((text, float(score)))
    return out


def test_fairseq_generate_with_gnmt(tiny_data, tmp_path):
    data_bin = str(tiny_data / "bin")
    save = str(tmp_path / "ck")
    # --eval-bleu validation decodes with GNMT normalisation too
    run(train_cmd(data_bin, save, "--lr", "5e-3", "--max-update", "30", "--length-norm", "gnmt",
                   "--validate-interval", "1000",  # validate once, at the end
                   "--eval-bleu", "--eval-bleu-args", '{"beam": 4, "max_len_a": 1, "max_len_b": 50}',
                   "--best-checkpoint-metric", "bleu", "--maximize-best-checkpoint-metric"))
    gen = [os.path.join(BIN, "fairseq-generate"), data_bin, "--user-dir", USER_DIR,
           "--task", "translation_qk", "--path", os.path.join(save, "checkpoint_last.pt"), "--beam", "4",
           "--nbest", "4", "--max-len-a", "1", "--max-len-b", "50", "--batch-size", "16", "--max-sentences", "16"]
    raw = _hypotheses(run(gen + ["--unnormalized"]).stdout)
    gnmt = _hypotheses(run(gen + ["--length-norm", "gnmt", "--gnmt-alpha", "0.6"]).stdout)
    assert len(raw) == 40 and raw.keys() == gnmt.keys()
    reordered = 0
    for i in raw:
        # beam search finalises the same hypotheses; only the scores and their order change
        assert sorted(t for t, _ in raw[i]) == sorted(t for t, _ in gnmt[i])
        raw_score = dict(raw[i])
        for text, score in gnmt[i]:
            n_tokens = len(text.split()) + 1  # + EOS
            assert score == pytest.approx(raw_score[text] / ((5 + n_tokens) / 6) ** 0.6, rel=1e-5, abs=1e-6)
        scores = [s for _, s in gnmt[i]]
        assert scores == sorted(scores, reverse=True)
        reordered += [t for t, _ in gnmt[i]] != [t for t, _ in raw[i]]
    assert reordered > 0, "no sentence changed ranking: the test corpus does not exercise the normalisation"
