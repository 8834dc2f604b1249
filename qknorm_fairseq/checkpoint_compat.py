"""Lets torch >= 2.6 load fairseq checkpoints, without turning off its safety checks.

torch 2.6 made torch.load(weights_only=True) the default. fairseq's checkpoints pickle a few
plain Python objects besides tensors (an argparse.Namespace of the training options, and the
types listed below), so fairseq-generate, fairseq-interactive, fairseq-validate and resumed
training fail with UnpicklingError. Instead of loading with weights_only=False (which would let
a checkpoint run arbitrary code), we add exactly these types to torch's allow-list. A checkpoint
that needs anything else still fails, with torch's message naming the type.
"""
import argparse
import collections

import torch

TRUSTED = [argparse.Namespace, collections.OrderedDict, collections.defaultdict]


def allow_fairseq_checkpoints():
    serialization = getattr(torch, "serialization", None)
    if serialization is not None and hasattr(serialization, "add_safe_globals"):
        serialization.add_safe_globals(TRUSTED)


allow_fairseq_checkpoints()
