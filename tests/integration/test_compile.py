"""--compile (qknorm_fairseq/compile.py): the layers' training forward through torch.compile gives
the eager model's outputs and gradients; evaluation stays eager; parameter names are unchanged."""
import pytest
import torch
from torch._dynamo.utils import counters

from helpers import batch, build


@pytest.mark.parametrize("arch, no_dropout", [
    ("transformer_qknorm", ["--word-dropout", "0"]),  # and compiled dropout draws other masks: none here
    ("transformer", [])])
def test_compiled_layers_train_as_the_eager_ones(tiny_data, arch, no_dropout):
    # one layer a stack: every layer is compiled on its own, so more layers only add compile time
    extra = ["--task", "translation_qk", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0",
             "--encoder-layers", "1", "--decoder-layers", "1", *no_dropout]
    eager, task = build(tiny_data / "bin", arch, *extra)
    compiled, _ = build(tiny_data / "bin", arch, *extra, "--compile")
    assert list(compiled.state_dict()) == list(eager.state_dict())
    src, lengths, prev = batch(task)
    torch._dynamo.reset()
    counters.clear()
    outs = []
    for model in (eager, compiled):
        model.train()
        logits = model(src, lengths, prev)[0]
        logits.float().masked_fill(logits.isinf(), 0).pow(2).mean().backward()  # -inf: the vocabulary mask
        outs.append((logits.detach(), [p.grad for p in model.parameters()]))
    assert counters["stats"]["unique_graphs"] > 0  # the compiled model really ran compiled code
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-5)
    for g_compiled, g_eager in zip(outs[1][1], outs[0][1]):
        torch.testing.assert_close(g_compiled, g_eager, rtol=1e-3, atol=1e-5)
    graphs = counters["stats"]["unique_graphs"]
    compiled.eval()
    with torch.no_grad():
        torch.testing.assert_close(compiled(src, lengths, prev)[0], eager.eval()(src, lengths, prev)[0])
    assert counters["stats"]["unique_graphs"] == graphs  # evaluation compiled nothing


def test_compile_needs_layers():
    from qknorm_fairseq.compile import compile_layers

    model = torch.nn.Module()
    model.encoder, model.decoder = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="has none: drop --compile"):
        compile_layers(model)
