"""The task's dictionaries: fairseq's, with `string` reading a token tensor once, not token by token.

fairseq's `Dictionary.string` walks a 1-D tensor element by element and handles each element as a
tensor (the element, `utils.item`, `== unk`, `idx < len`, the list index: an ATen op each), which
every validation pays for each hypothesis and reference of the dev set (--eval-bleu) and
fairseq-generate for each output. `bash scripts/benchmark.sh validation` times both ways on a
validation's own tokens (docs/gpu.md). The strings are the same: the tokens go to a Python list and
through fairseq's own code.
"""
import torch
from fairseq.data import Dictionary


class ListStringDictionary(Dictionary):
    def string(self, tensor, *args, **kwargs):
        if torch.is_tensor(tensor) and tensor.dim() == 1:
            tensor = tensor.tolist()
        return super().string(tensor, *args, **kwargs)
