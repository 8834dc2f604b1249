"""Length statistics of binarized training data (QKNorm's L and g0).

QKNorm initialises its scale to g0 = log2(L^2 - L), with L the 97.5th percentile of
training sequence lengths over source and target sides. L is read from the `.idx` files
that `fairseq-preprocess` wrote, so it counts BPE tokens plus EOS, as the model sees them.
"""
import math
import os

import numpy as np


def split_prefix(data_dir, split, src, tgt, lang):
    """The binarized SPLIT's LANG side as fairseq's translation task finds it: `SPLIT.SRC-TGT.LANG`, else the pair
    binarized the other way round, `SPLIT.TGT-SRC.LANG` (FileNotFoundError where neither has an .idx)."""
    prefixes = [os.path.join(data_dir, f"{split}.{a}-{b}.{lang}") for a, b in ((src, tgt), (tgt, src))]
    found = next((p for p in prefixes if os.path.exists(p + ".idx")), None)
    if found is None:
        raise FileNotFoundError(f"no binarized {split} split ({' or '.join(os.path.basename(p) + '.idx' for p in prefixes)}) "
                                f"in {data_dir}")
    return found


def read_sizes(prefix):
    """Sequence lengths stored in PREFIX.idx (fairseq mmap or legacy format)."""
    from fairseq.data import data_utils  # imported late: fairseq is slow to import

    if not os.path.exists(prefix + ".idx"):
        raise FileNotFoundError(f"{prefix}.idx not found: binarize the data with fairseq-preprocess first")
    ds = data_utils.load_indexed_dataset(prefix, None, dataset_impl=None)
    if ds is None:
        raise ValueError(f"{prefix}.idx is not a fairseq indexed dataset")
    # Copy: mmap datasets hand out views of memory-mapped files that die with the dataset.
    sizes = np.array(ds.sizes, dtype=np.int64, copy=True)
    del ds
    return sizes


def length_percentile(data_dir, src, tgt, percentile=97.5, split="train"):
    """The `percentile`-th percentile (numpy's linear interpolation) of the lengths of
    both sides of `split`, pooled."""
    sizes = np.concatenate([read_sizes(split_prefix(data_dir, split, src, tgt, lang)) for lang in (src, tgt)])
    if sizes.size == 0:
        raise ValueError(f"the {split} split in {data_dir} is empty")
    return float(np.percentile(sizes, percentile))


def g0_from_length(length):
    """QKNorm's initial scale g0 = log2(L^2 - L); needs L > 1."""
    if length <= 1:
        raise ValueError(f"QKNorm's g0 = log2(L^2 - L) needs L > 1, got L = {length}: give --qknorm-length "
                         "above 1 or --qknorm-g0")
    return math.log2(length * length - length)


def token_types(prefix):
    """Sorted array of the distinct token ids stored in PREFIX.bin (fairseq mmap format)."""
    from fairseq.data.indexed_dataset import MMapIndexedDataset

    if not os.path.exists(prefix + ".idx"):
        raise FileNotFoundError(f"{prefix}.idx not found: binarize the data with fairseq-preprocess first")
    ds = MMapIndexedDataset(prefix)
    types = np.unique(np.frombuffer(ds._bin_buffer, dtype=ds._index.dtype)).astype(np.int64)
    del ds
    return types
