"""`--compile`: each encoder and decoder layer's forward through torch.compile, in training only.

Validation and beam search keep the eager layers: incremental decoding changes shapes at every step
and would recompile. The compiled function is held outside the module tree, so parameter names and
checkpoints stay those of the eager model.
"""
import torch

from . import native


def compile_layers(model):
    layers = [layer for stack in (model.encoder, model.decoder) for layer in getattr(stack, "layers", [])]
    if not layers:
        raise ValueError(f"--compile compiles encoder and decoder layers; {type(model).__name__} has none: drop --compile")
    native.inductor_cache()
    for layer in layers:
        eager, compiled = layer.forward, torch.compile(layer.forward)

        def forward(*args, _layer=layer, _eager=eager, _compiled=compiled, **kwargs):
            return (_compiled if _layer.training else _eager)(*args, **kwargs)

        layer.forward = forward
    return len(layers)
