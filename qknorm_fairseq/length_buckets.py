"""`--length-buckets N`: training batches in a handful of shapes.

fairseq batches sentences of similar length up to --max-tokens and pads each batch to its own
longest sentence, so nearly every batch of an epoch has a shape of its own (TED gl->en: 157
batches, 157 shapes). Every new shape costs a GPU its caches (cuDNN attention plans, the
allocator's blocks, torch.compile graphs). Here the training sentences fall into N length buckets
(bounds at the quantiles of max(source, target) length, rounded up to a multiple of 8), every batch
of a bucket is padded to its bound in source and target alike and holds the same number of
sentences, max_tokens // bound (a multiple of --required-batch-size-multiple); the sentences left
over in a bucket move up to the next one. An epoch then has at most N + 1 shapes. The loss of a
batch does not depend on its padding; the cost is the padding itself, which the benchmark
(`bash scripts/benchmark.sh fairseq-train`) reports. Validation and test sets keep fairseq's
batching, so decoding is unchanged.
"""
import numpy as np
from fairseq.data import BaseWrapperDataset


def bucket_bounds(lengths, n, multiple=8):
    """N bounds at the quantiles of LENGTHS, each rounded up to MULTIPLE; the last covers the longest."""
    qs = np.quantile(np.asarray(lengths), np.arange(1, n + 1) / n, method="higher")
    bounds = np.unique(-(-qs // multiple) * multiple).astype(int)
    return [int(b) for b in bounds]


def batch_size(bound, max_tokens, max_sentences=None, multiple=1):
    size = max_tokens // bound if max_tokens else max_sentences
    if max_sentences:
        size = min(size, max_sentences)
    if size >= multiple:
        size -= size % multiple
    return max(size, 1)


def bucket_batches(indices, lengths, bounds, max_tokens, max_sentences=None, multiple=1):
    """Batches (arrays of INDICES) of equal size within a bucket; leftovers move to the next bucket."""
    which = np.searchsorted(bounds, lengths)  # the first bound >= length
    batches, carry = [], np.array([], dtype=np.int64)
    for b, bound in enumerate(bounds):
        members = np.concatenate([carry, indices[which == b]])
        size = batch_size(bound, max_tokens, max_sentences, multiple)
        full = len(members) // size * size
        batches += np.split(members[:full], full // size) if full else []
        carry = members[full:]
    if len(carry):
        batches.append(carry)
    return batches


class LengthBucketDataset(BaseWrapperDataset):
    """A LanguagePairDataset batched and padded by length buckets."""

    def __init__(self, dataset, n_buckets):
        super().__init__(dataset)
        self.bounds = bucket_bounds(dataset.num_tokens_vec(np.arange(len(dataset))), n_buckets)

    def bound(self, length):
        i = min(int(np.searchsorted(self.bounds, length)), len(self.bounds) - 1)
        return max(self.bounds[i], length)

    def batch_by_size(self, indices, max_tokens=None, max_sentences=None, required_batch_size_multiple=1):
        indices = np.asarray(indices, dtype=np.int64)
        return bucket_batches(indices, self.dataset.num_tokens_vec(indices), self.bounds, max_tokens,
                              max_sentences, required_batch_size_multiple)

    def collater(self, samples):
        if not samples:
            return {}
        longest = max(max(len(s["source"]), len(s["target"]) if s.get("target") is not None else 0)
                      for s in samples)
        length = self.bound(longest)
        return self.dataset.collater(samples, pad_to_length={"source": length, "target": length})
