"""FixNorm (Nguyen & Chiang 2018, as used in TwT): word embeddings l2-normalised at every use.

The embedding matrix is shared by source input, target input and output projection, so the
logits are h . w/||w||; with a final ScaleNorm they become g * cos(h, w).
"""
import torch
import torch.nn.functional as F
from torch import nn


class FixNormEmbedding(nn.Embedding):
    def __init__(self, num_embeddings, embedding_dim, padding_idx):
        super().__init__(num_embeddings, embedding_dim, padding_idx=padding_idx)
        nn.init.uniform_(self.weight, -0.01, 0.01)  # TwT section 3.2
        nn.init.zeros_(self.weight[padding_idx])
        self._cache = None

    def normalized_weight(self):
        # Decoding calls this once per step: cache the normalised matrix while no gradient is
        # needed and the weights have not changed (tracked by the tensor's version counter).
        w = self.weight
        if w.requires_grad and (self.training or torch.is_grad_enabled()):
            return F.normalize(w, dim=-1)
        key = (w._version, w.data_ptr(), w.dtype, w.device)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, F.normalize(w.detach(), dim=-1))
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
