"""Corpus BLEU as Moses' multi-bleu.perl and multi-bleu-detok.perl compute it, plus SacreBLEU.

Our own re-implementation (the perl scripts are not shipped). What each reproduces:

* ``multi_bleu``: multi-bleu.perl. Tokens are runs of non-whitespace, where whitespace is ASCII
  only (the script reads bytes, so perl's ``split`` never splits on U+00A0 and friends);
  case-sensitive; clipped n-gram counts against the maximum count over the references;
  reference length = the closest reference length (the shorter one on ties); a zero n-gram
  precision gives BLEU 0 (the script's ``my_log(0) = -9999999999``); no smoothing.
* ``multi_bleu_detok``: multi-bleu-detok.perl = the same statistics after the mteval-v13a
  tokenization that script applies to both sides (it reads UTF-8, so whitespace is Unicode).
* ``sacrebleu_score``: the sacrebleu library (13a tokenizer, exp smoothing) with its signature.

Two deliberate differences from the perl scripts, both for input the scripts mishandle:
an empty hypothesis corpus scores 0 (perl dies dividing by hyp_len = 0), and we strip only
the line terminator where perl's ``chop`` also eats the last character of a final line
that has no newline.

HTML escapes: Moses-tokenized corpora (TED, IWSLT) write ``&apos; &quot; &amp; &lt; &gt;
&#91; &#93; &#124;``. ``multi_bleu`` scores them as they are, like the papers did on the
tokenized text (hypotheses and references then carry the same escapes).
``multi_bleu_detok`` applies mteval-v13a's own rule (``&quot; &amp; &lt; &gt;`` are
unescaped, ``&apos;`` is not). The ``moses`` and ``treebank_unescape`` detokenizers undo every
Moses escape first; ``treebank`` (QKNorm Table 3) keeps them, as the authors did.
"""
import math
import os
import re
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from .. import files
from ..cli import UsageError

MAX_ORDER = 4

# Stats layout of one sentence (same order as sacrebleu's BLEU statistics):
# [hyp_len, ref_len, correct_1..4, total_1..4]
N_STATS = 2 + 2 * MAX_ORDER

_ASCII_SPACE = re.compile(rb"[ \t\n\r\x0b\x0c]+")
# Perl's \s on Unicode strings (multi-bleu-detok.perl decodes UTF-8).
_PERL_USPACE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
_USPACE_RUN = re.compile(f"[{_PERL_USPACE}]+")

MOSES_ESCAPES = {
    "&bar;": "|", "&#124;": "|", "&lt;": "<", "&gt;": ">", "&bra;": "[", "&ket;": "]",
    "&#91;": "[", "&#93;": "]", "&apos;": "'", "&quot;": '"', "&amp;": "&",
}
_MOSES_ESCAPE_RE = re.compile("|".join(re.escape(k) for k in MOSES_ESCAPES))


class ScoringError(UsageError):
    """Bad scorer input (missing/empty file, line counts differ)."""


@dataclass
class BleuResult:
    score: float          # 0..100
    precisions: list      # 0..100, one per order
    bp: float
    ratio: float
    hyp_len: int
    ref_len: int
    stats: np.ndarray = field(repr=False, default=None)  # per-sentence, shape (n, N_STATS)

    def __str__(self):
        p = "/".join(f"{x:.1f}" for x in self.precisions)
        return (f"BLEU = {self.score:.2f}, {p} (BP={self.bp:.3f}, ratio={self.ratio:.3f}, "
                f"hyp_len={self.hyp_len}, ref_len={self.ref_len})")


def read_lines(path, role="file"):
    """Lines of a UTF-8 text file (files.read_lines); clear errors for bad paths and empty files."""
    if not os.path.exists(path):
        raise ScoringError(f"{role} {path!r} does not exist")
    if os.path.isdir(path):
        raise ScoringError(f"{role} {path!r} is a directory, expected a text file")
    lines = files.read_lines(path)
    if not lines:
        raise ScoringError(f"{role} {path!r} is empty: nothing to score")
    return lines


def check_parallel(hyp_lines, ref_sets, hyp_name="hypothesis", ref_names=None):
    ref_names = ref_names or [f"reference {i}" for i in range(len(ref_sets))]
    if not hyp_lines:
        raise ScoringError(f"{hyp_name} has no lines: nothing to score")
    for name, refs in zip(ref_names, ref_sets):
        if len(refs) != len(hyp_lines):
            raise ScoringError(
                f"{hyp_name} has {len(hyp_lines)} lines but {name} has {len(refs)}: "
                "hypotheses and references must be line-parallel (one translation per reference line)")


def _ngrams(tokens, n):
    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))


def sentence_stats(hyp_tokens, ref_token_lists):
    """multi-bleu.perl's statistics for one sentence, as a length-N_STATS list."""
    hyp_len = len(hyp_tokens)
    closest_diff, closest_len = None, None
    max_ref = Counter()
    for ref in ref_token_lists:
        diff = abs(hyp_len - len(ref))
        if closest_diff is None or diff < closest_diff or (diff == closest_diff and len(ref) < closest_len):
            closest_diff, closest_len = diff, len(ref)
        for n in range(1, MAX_ORDER + 1):
            for g, c in _ngrams(ref, n).items():
                if c > max_ref[g]:
                    max_ref[g] = c
    correct = [0] * MAX_ORDER
    total = [0] * MAX_ORDER
    for n in range(1, MAX_ORDER + 1):
        for g, c in _ngrams(hyp_tokens, n).items():
            total[n - 1] += c
            correct[n - 1] += min(c, max_ref.get(g, 0))
    return [hyp_len, closest_len] + correct + total


def bleu_from_stats(totals):
    """multi-bleu.perl's corpus BLEU from summed statistics (array of shape (..., N_STATS)).

    Vectorised over leading dimensions (used by the bootstrap). Returns BLEU in 0..100.
    """
    totals = np.asarray(totals, dtype=np.float64)
    hyp_len, ref_len = totals[..., 0], totals[..., 1]
    correct, total = totals[..., 2:2 + MAX_ORDER], totals[..., 2 + MAX_ORDER:]
    with np.errstate(divide="ignore", invalid="ignore"):
        prec = np.where(total > 0, correct / np.where(total > 0, total, 1), 0.0)
        log_p = np.where(prec > 0, np.log(np.where(prec > 0, prec, 1)), -np.inf)
        bp = np.where(hyp_len < ref_len, np.exp(1 - ref_len / np.where(hyp_len > 0, hyp_len, 1)), 1.0)
        bleu = bp * np.exp(log_p.sum(-1) / MAX_ORDER)
    bleu = np.where((hyp_len > 0) & (ref_len > 0), bleu, 0.0)
    return 100 * bleu


def _result(stats):
    stats = np.asarray(stats, dtype=np.int64).reshape(-1, N_STATS)
    tot = stats.sum(0)
    hyp_len, ref_len = int(tot[0]), int(tot[1])
    correct, total = tot[2:2 + MAX_ORDER], tot[2 + MAX_ORDER:]
    precisions = [100.0 * c / t if t else 0.0 for c, t in zip(correct, total)]
    if hyp_len == 0 or ref_len == 0:
        bp = 0.0
    else:
        bp = math.exp(1 - ref_len / hyp_len) if hyp_len < ref_len else 1.0
    return BleuResult(score=float(bleu_from_stats(tot)), precisions=precisions, bp=bp,
                      ratio=hyp_len / ref_len if ref_len else 0.0, hyp_len=hyp_len,
                      ref_len=ref_len, stats=stats)


def multi_bleu_tokens(line):
    """multi-bleu.perl's tokens: split on ASCII whitespace only (the script reads bytes)."""
    return [t for t in _ASCII_SPACE.split(line.encode("utf-8")) if t]


def mteval_13a_tokenize(line):
    """The mteval-v13a tokenization inside multi-bleu-detok.perl (case preserved)."""
    s = line.replace("<skipped>", "").replace("-\n", "").replace("\n", " ")
    s = s.replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<").replace("&gt;", ">")
    s = f" {s} "
    s = re.sub(r"([\{-\~\[-\` -\&\(-\+\:-\@\/])", r" \1 ", s)
    s = re.sub(r"([^0-9])([\.,])", r"\1 \2 ", s)
    s = re.sub(r"([\.,])([^0-9])", r" \1 \2", s)
    s = re.sub(r"([0-9])(-)", r"\1 \2 ", s)
    return _USPACE_RUN.sub(" ", s).strip(" ")


def multi_bleu_detok_tokens(line):
    return [t for t in _USPACE_RUN.split(mteval_13a_tokenize(line)) if t]


def _corpus(hyps, ref_sets, tokenize):
    check_parallel(hyps, ref_sets)
    stats = []
    for i, h in enumerate(hyps):
        stats.append(sentence_stats(tokenize(h), [tokenize(refs[i]) for refs in ref_sets]))
    return _result(stats)


def multi_bleu(hyps, ref_sets):
    """multi-bleu.perl on lists of lines. ``ref_sets``: list of reference line lists."""
    return _corpus(hyps, ref_sets, multi_bleu_tokens)


def multi_bleu_detok(hyps, ref_sets):
    """multi-bleu-detok.perl on lists of (detokenized) lines."""
    return _corpus(hyps, ref_sets, multi_bleu_detok_tokens)


def sacrebleu_metric(**kwargs):
    from sacrebleu.metrics import BLEU

    return BLEU(**kwargs)


def sacrebleu_score(hyps, ref_sets, **kwargs):
    """(BLEU score object, signature string, per-sentence stats, metric) from the sacrebleu library."""
    check_parallel(hyps, ref_sets)
    # force: we score what we were given on purpose (detok none = the tokenized text)
    metric = sacrebleu_metric(**{"force": True, **kwargs})
    score = metric.corpus_score(hyps, ref_sets)
    return score, str(metric.get_signature()), sacrebleu_stats(hyps, ref_sets, **kwargs), metric


def sacrebleu_stats(hyps, ref_sets, **kwargs):
    """Per-sentence statistics in our layout from sacrebleu's public sentence_score (its counts do
    not depend on effective_order, which only silences its sentence-level warning)."""
    metric = sacrebleu_metric(**{"force": True, **kwargs, "effective_order": True})
    rows = [[s.sys_len, s.ref_len, *s.counts, *s.totals]
            for s in (metric.sentence_score(h, [refs[i] for refs in ref_sets]) for i, h in enumerate(hyps))]
    return np.array(rows, dtype=np.int64).reshape(-1, N_STATS)


def sacrebleu_from_stats(metric, stats):
    """sacrebleu's corpus BLEU (with METRIC's smoothing) from summed statistics in our layout."""
    from sacrebleu.metrics import BLEU

    return BLEU.compute_bleu(correct=[int(x) for x in stats[2:2 + MAX_ORDER]],
                             total=[int(x) for x in stats[2 + MAX_ORDER:N_STATS]], sys_len=int(stats[0]),
                             ref_len=int(stats[1]), smooth_method=metric.smooth_method,
                             smooth_value=metric.smooth_value).score


def unescape_moses(line):
    """Undo the HTML escapes Moses' tokenizer writes (``&apos;`` -> ``'`` and so on)."""
    return _MOSES_ESCAPE_RE.sub(lambda m: MOSES_ESCAPES[m.group(0)], line)


DETOKENIZERS = ("none", "moses", "treebank", "treebank_unescape")


def detokenize(lines, method, lang="en"):
    """Detokenize Moses-tokenized lines: ``none`` (as is), ``moses`` (sacremoses, which also
    unescapes), ``treebank`` (NLTK's TreebankWordDetokenizer on the Moses-escaped text as it is:
    the authors' procedure, which reproduces QKNorm Table 3's 32.41 / 33.18), ``treebank_unescape``
    (the same after undoing the escapes: 32.43 / 33.19)."""
    if method == "none":
        return list(lines)
    if method == "moses":
        from sacremoses import MosesDetokenizer

        md = MosesDetokenizer(lang=lang)
        return [md.detokenize(line.split(), unescape=True) for line in lines]
    if method in ("treebank", "treebank_unescape"):
        from nltk.tokenize.treebank import TreebankWordDetokenizer

        td = TreebankWordDetokenizer()
        prepare = unescape_moses if method == "treebank_unescape" else str
        return [td.detokenize(prepare(line).split()) for line in lines]
    raise ScoringError(f"unknown detokenizer {method!r}: use one of {', '.join(DETOKENIZERS)}")


def escape_mismatch(hyps, refs):
    """A warning (str) when references carry Moses escapes and hypotheses use raw quotes
    instead (or the reverse): tokenized BLEU then misses every apostrophe. None if consistent."""
    def uses(lines):
        esc = sum(("&apos;" in x or "&quot;" in x) for x in lines)
        raw = sum(("'" in x or '"' in x) for x in lines)
        return esc, raw

    he, hr = uses(hyps)
    re_, rr = uses(refs)
    if re_ and not he and hr:
        return ("references use Moses escapes (&apos; &quot;) but hypotheses use raw ' and \": "
                "tokenized BLEU will not match them; escape the hypotheses or use --detok")
    if he and not re_ and rr:
        return ("hypotheses use Moses escapes (&apos; &quot;) but references use raw ' and \": "
                "unescape the hypotheses or use --detok")
    return None
