"""BLEU scoring and significance for qknorm-fairseq (not a fairseq plugin: registers nothing).

    python -m qknorm_pipeline.scoring --ref REF --sys NAME=HYP [--sys ...] [--baseline NAME] [--json]
"""
from .bleu import (  # noqa: F401
                   BleuResult,
                   ScoringError,
                   detokenize,
                   mteval_13a_tokenize,
                   multi_bleu,
                   multi_bleu_detok,
                   read_lines,
                   sacrebleu_score,
)
from .score import METRICS, score_systems  # noqa: F401
