"""cuDNN's attention kernel off unless QKNORM_CUDNN_ATTENTION=1 (results/gpu/README.md, 2026-11-26).

torch >= 2.9 hands scaled_dot_product_attention in bf16/fp16 to cuDNN first on Hopper GPUs, and
cuDNN builds an execution plan for every new input shape. fairseq batches by tokens, so most
batches of a first epoch and every step of a beam search are new shapes. The plugin's import
switches it off, so every entry point gets flash or memory-efficient attention instead: train.sh,
evaluate.sh, `fairseq-train/-generate --user-dir qknorm_fairseq`, and the stock rows our
entry point starts. It changes which kernel runs, not the result beyond rounding.
"""
import os

import torch

ENV = "QKNORM_CUDNN_ATTENTION"


def apply():
    value = os.environ.get(ENV, "0")
    if value not in ("0", "1"):
        raise ValueError(f"{ENV}={value!r}: set it to 1 (keep cuDNN attention) or 0 (off, the default), or unset it")
    torch.backends.cuda.enable_cudnn_sdp(value == "1")


apply()
