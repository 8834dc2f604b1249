"""The task's dictionaries: fairseq's, with `string` reading a token tensor once, not token by token.

fairseq's `Dictionary.string` walks a 1-D tensor element by element and compares each element as a
tensor (`utils.item`, `== unk`, `idx < len`, the list index): about seven ATen ops a token, which
every validation pays for each hypothesis and reference of the dev set (--eval-bleu) and
fairseq-generate for each output. On TED gl->en's dev references that is 0.5 s against 0.03 s from
a list (`bash scripts/benchmark.sh validation` times both on a validation's own tokens). The strings
are the same: the tokens go to a Python list and through fairseq's own code.
"""
import torch
from fairseq.data import Dictionary


class ListStringDictionary(Dictionary):
    def string(self, tensor, *args, **kwargs):
        if torch.is_tensor(tensor) and tensor.dim() == 1:
            tensor = tensor.tolist()
        return super().string(tensor, *args, **kwargs)
