"""qknorm_pipeline/evaluate.py: the hypotheses it scores from fairseq-generate's output."""
from qknorm_pipeline import evaluate


def test_hypotheses_come_in_corpus_order_and_with_nbest_each_sentences_best(tmp_path):
    """fairseq-generate prints sentences by length bucket and, with --nbest N, N H- lines a sentence, best first:
    the scored text is each sentence's first H- line, in sentence order."""
    out = tmp_path / "generate.out"
    out.write_text("S-1\tb\nH-1\t-0.1\tbest of one\nD-1\t-0.1\tbest of one\nH-1\t-0.9\tsecond of one\n"
                   "S-0\ta\nH-0\t-0.2\tbest of zero\nH-0\t-0.5\tsecond of zero\n"
                   "S-2\tc\nH-2\t-0.3\t\n", encoding="utf-8")
    assert evaluate.hypotheses(out) == ["best of zero", "best of one", ""]
