"""qknorm_fairseq/dictionary.py: the task's dictionaries make fairseq's strings from lists."""
import itertools

import torch
from fairseq.data import Dictionary

from qknorm_fairseq.dictionary import ListStringDictionary
from qknorm_fairseq.task import TranslationQKTask

WORDS = ["the", "ca@@", "t", "sat", "o@@", "n", "&quot;", "UNKNOWNTOKENINREF"]


def dictionaries():
    theirs, ours = Dictionary(), ListStringDictionary()
    for w in WORDS:
        theirs.add_symbol(w)
        ours.add_symbol(w)
    return theirs, ours


def test_strings_equal_fairseqs_for_every_option_and_input():
    theirs, ours = dictionaries()
    g = torch.Generator().manual_seed(0)
    # every special index (bos, pad, eos, unk) and every word, in random sequences, one past the end too
    rows = [torch.randint(0, len(theirs) + 1, (n,), generator=g) for n in (0, 1, 5, 40)]
    inputs = [*rows, *(r.int() for r in rows), torch.stack([rows[2], rows[2].flip(0)])]
    options = itertools.product((None, "@@ ", "subword_nmt"), (False, True), (None, [theirs.index("sat")]),
                                (None, "UNKNOWNTOKENINHYP"), (False, True), (" ", ""))
    for bpe, escape, extra, unk, eos, sep in options:
        for t in inputs:
            kw = dict(bpe_symbol=bpe, escape_unk=escape, extra_symbols_to_ignore=extra, unk_string=unk,
                      include_eos=eos, separator=sep)
            assert ours.string(t, **kw) == theirs.string(t, **kw), (t, kw)
    assert ours.string([4, 5, 6]) == theirs.string(torch.tensor([4, 5, 6]))


def test_the_task_loads_its_dictionaries_as_lists_of_strings(tiny_data):
    d = TranslationQKTask.load_dictionary(str(tiny_data / "bin" / "dict.tgt.txt"))
    assert type(d) is ListStringDictionary and d == Dictionary.load(str(tiny_data / "bin" / "dict.tgt.txt"))
