"""Lets torch >= 2.6 load fairseq checkpoints, without turning off its safety checks.

torch 2.6 made torch.load(weights_only=True) the default. fairseq's checkpoints pickle a few
plain Python objects besides tensors (an argparse.Namespace of the training options, numpy
numbers such as the best dev BLEU, and the containers listed below), so fairseq-generate, fairseq-interactive, fairseq-validate and resumed
training fail with UnpicklingError. Instead of loading with weights_only=False (which would let
a checkpoint run arbitrary code), we add exactly these types to torch's allow-list. A checkpoint
that needs anything else still fails, with torch's message naming the type.
"""
import argparse
import collections

import numpy as np
import torch

try:  # numpy >= 2
    from numpy._core.multiarray import _reconstruct, scalar
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct, scalar

# numpy arrays and scalars of plain numeric dtypes (object arrays stay forbidden: their elements
# would be arbitrary pickles)
NUMERIC_DTYPES = [type(np.dtype(t)) for t in (np.float16, np.float32, np.float64, np.int32, np.int64, np.bool_)]
TRUSTED = [argparse.Namespace, collections.OrderedDict, collections.defaultdict,
           _reconstruct, scalar, np.ndarray, np.dtype, *NUMERIC_DTYPES]


def allow_fairseq_checkpoints():
    serialization = getattr(torch, "serialization", None)
    if serialization is not None and hasattr(serialization, "add_safe_globals"):
        serialization.add_safe_globals(TRUSTED)


allow_fairseq_checkpoints()
