"""FixNorm (Nguyen & Chiang 2018, as used in TwT): word embeddings l2-normalised at every use.

The embedding matrix is shared by source input, target input and output projection, so the
logits are h . w/||w||; with a final ScaleNorm they become g * cos(h, w).
"""
from contextlib import ExitStack, contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from .norms import l2_normalize


def _normalize(w):
    # In fp32: F.normalize's eps (1e-12) is 0 in fp16, so the all-zero padding row became 0/0 = NaN
    # and fp16 training of every FixNorm preset stopped at its first step (seen on an H100).
    # F.normalize(w.float(), dim=-1) to the bit, forward and backward, in fewer ops (norms.py).
    return l2_normalize(w.float(), 1e-12).type_as(w)


class FixNormEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, padding_idx):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        nn.init.uniform_(self.weight, -0.01, 0.01)  # TwT section 3.2
        nn.init.zeros_(self.weight[padding_idx])
        self._cache = None
        self._sharing, self._shared = False, None

    @contextmanager
    def shared_normalization(self):
        """One model forward uses the matrix up to three times (source, target, output layer):
        normalise it once, in one autograd graph, instead of three times forward and backward."""
        self._sharing = True
        try:
            yield
        finally:
            self._sharing, self._shared = False, None

    def train(self, mode=True):
        # fairseq's optimizers write parameters through .data, which the version counter of the
        # cache key does not see: drop the cache at every switch between training and evaluation
        self._cache = None
        return super().train(mode)

    def normalized_weight(self):
        w = self.weight
        if self.training or (w.requires_grad and torch.is_grad_enabled()):
            if not self._sharing:
                return _normalize(w)
            if self._shared is None:
                self._shared = _normalize(w)
            return self._shared
        # Decoding calls this once per step: in evaluation mode without gradients, cache the
        # normalised matrix while the weights have not changed (version counter, see train()).
        key = (w._version, w.data_ptr(), w.dtype, w.device)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, _normalize(w.detach()))
        return self._cache[1]

    def forward(self, tokens):
        return F.embedding(tokens, self.normalized_weight(), self.padding_idx)


class FixNormOutputProjection(nn.Module):
    """Output layer tied to a FixNormEmbedding: logits = features . normalised embeddings."""

    def __init__(self, embedding: FixNormEmbedding):
        super().__init__()
        self.embedding = [embedding]  # a list: register no second copy of the shared parameter
        self.weight = embedding.weight  # fairseq code reads output_projection.weight

    def forward(self, features):
        # as a 2-D matmul: F.linear on the decoder's (batch, 1, d) step features took a batched
        # matmul 3x slower than nn.Linear's plain mm in beam search (profiled on CPU)
        flat = F.linear(features.reshape(-1, features.size(-1)), self.embedding[0].normalized_weight())
        return flat.view(*features.shape[:-1], -1)


@contextmanager
def shared_fixnorm(*modules):
    """shared_normalization() of every distinct FixNormEmbedding among `modules`."""
    with ExitStack() as stack:
        for m in {id(m): m for m in modules if isinstance(m, FixNormEmbedding)}.values():
            stack.enter_context(m.shared_normalization())
        yield
