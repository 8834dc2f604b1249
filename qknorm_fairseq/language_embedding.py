"""The original code bases' language embedding (`--language-embeddings`).

Both add `lang_embedding[lang]`, a learned vector initialised N(0, d^-0.5), to the scaled word
embedding and the position table of every input token, the source language's in the encoder and the
target language's in the decoder (TwT's model.py, `get_input`; the QKNorm code's alike). A bilingual model has one vector a side.
fairseq adds its positions at the same place, before the input dropout, in both the encoder and the
decoder (one step at a time in beam search), so the vector rides on the position module's output.
"""
import torch
from torch import nn


class PositionsWithLanguage(nn.Module):
    """POSITIONS(tokens, ...) + one learned vector, broadcast over batch and time."""

    def __init__(self, positions, dim):
        super().__init__()
        self.positions = positions
        self.language = nn.Parameter(torch.empty(dim).normal_(mean=0.0, std=dim ** -0.5))

    @property
    def max_positions(self):
        return self.positions.max_positions

    def forward(self, *args, **kwargs):
        return self.positions(*args, **kwargs) + self.language


def add_language_embedding(module, cfg):
    """Give an encoder or decoder built by fairseq its side's language vector."""
    if not cfg.language_embeddings:
        return
    if module.embed_positions is None:
        raise ValueError("--language-embeddings adds its vector where fairseq adds positions: drop "
                         "--no-token-positional-embeddings")
    module.embed_positions = PositionsWithLanguage(module.embed_positions, module.embed_tokens.embedding_dim)
