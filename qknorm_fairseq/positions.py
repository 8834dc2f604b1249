"""The original code bases' fixed position tables, as fairseq position embeddings (`--positions`).

Both original repositories add `get_positional_encoding(dim, length)` (utils.py) to the scaled
word embeddings, numbering each sentence's tokens from 0. For dimension j and position n the
angle is  n * 10000 ** (-2 * floor(j / 2) / dim);  even dimensions hold its sine, odd ones:
- `twt`: its cosine (TwT's code since commit 2502606, the usual table);
- `qknorm`: its sine again (the QKNorm code forked before that fix, so odd dimensions repeat the
  even ones). The QKNorm paper's numbers were produced with this table.
fairseq's own table (`fairseq`, the default) puts the sines of all frequencies in the first half,
the cosines in the second, with frequencies 10000 ** (-i / (dim/2 - 1)).

fairseq numbers a sentence's tokens from padding_idx + 1 (left padding skipped); row
padding_idx + 1 + n of the table here is the original's position n, row padding_idx is zeros.
"""
import torch
from fairseq.modules import SinusoidalPositionalEmbedding

# --positions NAME -> the function on odd dimensions of the original code's table; None: fairseq's own
POSITIONS = {"fairseq": None, "twt": torch.cos, "qknorm": torch.sin}


def original_table(length, dim, odd):
    """The original code's table, positions 0..length-1; ODD is torch.sin (QKNorm) or torch.cos (TwT)."""
    j = torch.arange(dim)
    angle = torch.arange(length, dtype=torch.float)[:, None] * 10000.0 ** (-(j // 2) * 2.0 / dim)[None, :]
    return torch.where(j % 2 == 0, torch.sin(angle), odd(angle))


class OriginalPositions(SinusoidalPositionalEmbedding):
    def __init__(self, dim, padding_idx, odd, init_size):
        super().__init__(dim, padding_idx, init_size)
        self.odd = odd
        self.weights = self.table(init_size)

    def table(self, rows):
        offset = self.padding_idx + 1
        out = torch.zeros(rows, self.embedding_dim)
        out[offset:] = original_table(rows - offset, self.embedding_dim, self.odd)
        return out

    def forward(self, input, incremental_state=None, timestep=None, positions=None):
        rows = self.padding_idx + 1 + input.size(1)
        if rows > self.weights.size(0):  # fairseq's forward would extend it with its own table
            self.weights = self.table(rows).to(self.weights)
        return super().forward(input, incremental_state, timestep, positions)


def build_positions(kind, max_positions, dim, padding_idx):
    """The position embedding of `--positions KIND`, sized as fairseq sizes its own."""
    return OriginalPositions(dim, padding_idx, POSITIONS[kind], max_positions + padding_idx + 1)
