"""--packed-decoder: the decoder's training forward on the target's tokens only (qknorm_fairseq/decoder_rows.py)
gives the padded decoder's loss and gradients, for every kind of decoder layer."""
import itertools

import numpy as np
import pytest
import torch

from qknorm_fairseq import decoder_rows, native
from qknorm_fairseq.criterion import MaskedLabelSmoothedCrossEntropyCriterion
from qknorm_fairseq.decoder_rows import Rows, group_sizes, padded_size

from helpers import NO_DROPOUT, Backward, build, train_sample

# softmax over dot products, QKNorm (p = 2), Lp-QKNorm (p = 4); pre- and post-norm; LayerNorm, ScaleNorm,
# RMSNorm; FixNorm's tied output layer; HNAS in the encoder; the matmul kernel, output bias and vocabulary mask;
# the output layer over all types (every preset but the last masks the vocabulary: logits of the allowed types)
CASES = [("transformer_qknorm",), ("transformer_lpqknorm",), ("transformer_postnorm",), ("transformer_prenorm",),
         ("transformer_scalenorm",), ("transformer_rmsnorm",), ("transformer_fixnorm",),
         ("transformer_hnas",),
         ("transformer_qknorm", "--attention-kernel", "matmul", "--output-bias", "--target-vocab-mask"),
         ("transformer_qknorm", "--no-target-vocab-mask")]


def _loss_and_grads(model, task, criterion, sample, packed):
    model.decoder.packed = packed
    model.zero_grad()
    loss, size, log = task.train_step(sample, model, criterion, Backward(), update_num=0)
    return loss.item(), float(log["nll_loss"]), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("fused", [True, False], ids=["fused-loss", "log-softmax"])
@pytest.mark.parametrize("case", CASES, ids=" ".join)
def test_the_packed_decoder_gives_the_padded_decoders_loss_and_gradients(tiny_data, case, fused):
    model, task = build(tiny_data / "bin", *case, *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         fused_loss=fused)
    sample = train_sample(task)
    pad = task.tgt_dict.pad()
    assert sample["target"].eq(pad).any(), "the batch must hold padding for the test to mean anything"
    if model.decoder.output_bias is not None:  # zero-initialised: a wrong bias would show in no forward
        with torch.no_grad():
            model.decoder.output_bias.normal_()
    # with the vocabulary mask, the logits of the allowed types only
    assert ("packed_types" in model(**sample["net_input"])[1]) == model.decoder.mask_output
    padded, packed = (_loss_and_grads(model, task, criterion, sample, p) for p in (False, True))
    assert packed[0] == pytest.approx(padded[0], rel=1e-5)
    assert packed[1] == pytest.approx(padded[1], rel=1e-5)
    assert packed[2].keys() == padded[2].keys()
    # atol on the largest gradient's scale: some gradients are zero but for rounding (softmax ignores
    # the key projection's bias)
    scale = max(g.abs().max().item() for g in padded[2].values())
    assert scale > 0
    for name, g in padded[2].items():
        assert torch.allclose(packed[2][name], g, rtol=1e-4, atol=1e-6 * scale), name


def test_the_packed_decoder_computes_one_row_per_target_token_in_training_only(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    sample = train_sample(task)
    real = sample["target"].ne(task.tgt_dict.pad())
    model.train()
    logits, extra = model(**sample["net_input"])
    # the allowed types' logits only, the targets as their columns
    allowed = model.decoder.allowed_types
    assert 0 < int(allowed.sum()) < len(allowed)
    assert logits.shape == (int(real.sum()), int(allowed.sum())) and real.sum() < sample["target"].numel()
    targets = model.get_targets(sample, (logits, extra))
    assert torch.equal(allowed.nonzero().squeeze(1)[targets], sample["target"][real])
    # some target is column padding_idx, which the criterion must not take for padding
    assert targets.eq(task.tgt_dict.pad()).any()
    model.eval()  # validation's loss and beam search: the padded decoder, fairseq's (batch, length, V) logits
    full, extra = model(**sample["net_input"])
    assert full.shape == (*sample["target"].shape, len(task.tgt_dict)) and "packed_rows" not in extra
    assert torch.isinf(full[..., ~allowed]).all()
    # the same values as the allowed columns of the padded decoder's logits
    model.train()
    assert torch.allclose(logits, full[real][:, allowed], rtol=1e-5, atol=1e-5)


def test_the_packed_decoder_reports_the_padded_decoders_accuracy(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         report_accuracy=True)
    sample = train_sample(task)
    logs = []
    for packed in (False, True):
        model.decoder.packed = packed
        logs.append(criterion(model, sample)[2])
    assert logs[1]["total"] == logs[0]["total"] == int(sample["target"].ne(task.tgt_dict.pad()).sum())
    assert logs[1]["n_correct"] == logs[0]["n_correct"] > 0


@pytest.mark.parametrize("fused", [True, False], ids=["fused-loss", "log-softmax"])
def test_the_packed_decoder_gives_the_padded_decoders_loss_with_the_original_codes_smoothing(tiny_data, fused):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         fused_loss=fused, label_smoothing_form="uniform")
    sample = train_sample(task)
    padded, packed = (_loss_and_grads(model, task, criterion, sample, p)[:2] for p in (False, True))
    assert packed == pytest.approx(padded, rel=1e-5)


def test_another_criterion_gets_every_types_logits(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder",
                        "--criterion", "cross_entropy")
    model.train()
    logits, extra = model(**train_sample(task)["net_input"])
    assert not model.decoder.allowed_only and logits.size(-1) == len(task.tgt_dict) and "packed_types" not in extra


def test_a_loaded_mask_is_checked_against_the_training_targets_and_its_columns_rebuilt(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    sample = train_sample(task)
    model.train()
    allowed = model.decoder.allowed_types
    n = int(allowed.sum())
    assert model(**sample["net_input"])[0].size(-1) == n
    # a checkpoint's mask that allows one more type: one more column
    state = model.state_dict()
    state["decoder.allowed_types"] = allowed.clone()
    state["decoder.allowed_types"][int((~allowed).nonzero()[-1])] = True
    model.load_state_dict(state)
    logits, extra = model(**sample["net_input"])
    assert logits.size(-1) == n + 1
    assert torch.equal(model.decoder.allowed_types.nonzero().squeeze(1)[model.get_targets(sample, (logits, extra))],
                       sample["target"][sample["target"].ne(task.tgt_dict.pad())])
    # one that forbids a type of the training targets: translation_qk's training allows it again ...
    gold = int(sample["target"][0, 0])
    state["decoder.allowed_types"][gold] = False
    model.load_state_dict(state)
    assert model.decoder.allowed_types[gold] and model(**sample["net_input"])[0].size(-1) == n + 1
    # ... another task's, which may be loading the checkpoint to decode, is refused before any loss
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder", "--task", "translation")
    model.train()
    state["decoder.allowed_types"][gold] = False  # (the load above widened the dict's mask, as fairseq's upgrades do)
    model.load_state_dict(state)
    with pytest.raises(ValueError, match=r"the target vocabulary mask \(loaded from a checkpoint trained on other "
                                         r"data\) forbids 1 of the training targets' types, .*drop --packed-decoder"):
        model(**sample["net_input"])


def _groups_cost(lengths, sizes):
    first, cost = 0, 0
    for size in sizes:
        cost, first = cost + size * lengths[first] ** 2, first + size
    return cost


def _best_groups(lengths, max_groups, min_gain):
    """group_sizes by exhaustive search: every cut of every group count, one more group kept only
    where it cuts the cost by min_gain"""
    n, best = len(lengths), [len(lengths)]
    for count in range(2, max_groups + 1):
        cuts = [list(c) for c in itertools.combinations(range(1, n), count - 1)]
        if not cuts:
            break
        sizes = min(([b - a for a, b in zip([0] + c, c + [n])] for c in cuts), key=lambda s: _groups_cost(lengths, s))
        if _groups_cost(lengths, sizes) > (1 - min_gain) * _groups_cost(lengths, best):
            break
        best = sizes
    return best


def test_group_sizes_have_the_least_padded_attention_area():
    rng = np.random.default_rng(0)
    for _ in range(200):
        lengths = sorted(rng.integers(1, 30, rng.integers(1, 10)).tolist(), reverse=True)
        for max_groups, min_gain in ((1, 0.0), (2, 0.0), (3, 0.0), (3, 0.15)):
            sizes = group_sizes(lengths, max_groups, min_gain)
            assert sum(sizes) == len(lengths) and len(sizes) <= max_groups
            assert _groups_cost(lengths, sizes) == _groups_cost(lengths, _best_groups(lengths, max_groups, min_gain))
    # equal lengths: one group; one long sentence among short ones: a group of its own
    assert group_sizes([9, 9, 9], 3) == [3]
    assert group_sizes([40, 5, 5, 5, 5], 3) == [1, 4]


def test_rows_take_each_token_once_and_group_grids_put_them_back():
    # right- and left-padded sentences (the last one) of very different lengths
    tokens = torch.tensor([[5, 6, 1, 1, 1, 1, 1, 1], [7, 8, 9, 4, 4, 4, 4, 1], [3, 1, 1, 1, 1, 1, 1, 1],
                           [1, 1, 1, 5, 6, 7, 8, 9]])
    rows = Rows(tokens, pad=1, max_groups=3)
    real = tokens.ne(1)
    # every token once
    assert sorted(rows.index.tolist()) == real.view(-1).nonzero().squeeze(1).tolist()
    x = torch.arange(32.0).view(4, 8, 1) + 100 * real.view(4, 8, 1)
    taken = rows.take(x)
    assert taken.min() >= 100
    # the groups, longest sentences first, each grid holding its sentences' tokens in order, pads after them
    assert [(g.count, g.length) for g in rows.groups] == [(1, 7), (1, 5), (2, 2)]
    sentences = [1, 3, 0, 2]
    grids = [g.grid(taken.view(-1, 1, 1))[:, 0, :, 0] for g in rows.groups]
    flat = [row[:n].tolist() for grid in grids for row in grid for n in [int((row != 0).sum())]]
    assert flat == [x[b][real[b]].view(-1).tolist() for b in sentences]
    assert all(bool(row[n:].eq(0).all()) for grid in grids for row in grid for n in [int((row != 0).sum())])
    assert rows.groups[2].key_pad.tolist() == [[False, False], [False, True]] and rows.groups[0].key_pad is None
    assert [g.sentences.tolist() for g in rows.groups] == [[1], [3], [0, 2]]
    # from_grids is grids' inverse
    assert torch.equal(rows.from_grids([grid[:, None, :, None] for grid in grids]).view(-1), taken.view(-1))
    # one group: the batch's order, the batch's sentences
    one = Rows(tokens, pad=1, max_groups=1)
    assert one.index.tolist() == real.view(-1).nonzero().squeeze(1).tolist()
    assert len(one.groups) == 1 and one.groups[0].sentences is None and one.split(tokens) == [tokens]
    grid = one.groups[0].grid(one.take(x).view(-1, 1, 1))[:, 0, :, 0]
    assert grid.shape == (4, 7)
    assert [row[row != 0].tolist() for row in grid] == [x[b][real[b]].view(-1).tolist() for b in range(4)]


def test_packed_groups_give_the_loss_and_gradients_of_one_grid(tiny_data):
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    sample = train_sample(task)
    assert model.decoder.packed_groups == 3  # the default
    two, _ = build(tiny_data / "bin", "transformer_qknorm", "--packed-decoder", "--packed-groups", "2")
    assert two.decoder.packed_groups == 2
    assert len(Rows(sample["net_input"]["prev_output_tokens"], task.tgt_dict.pad(), 3).groups) > 1
    grouped = _loss_and_grads(model, task, criterion, sample, True)
    model.decoder.packed_groups = 1
    one = _loss_and_grads(model, task, criterion, sample, True)
    assert grouped[:2] == pytest.approx(one[:2], rel=1e-5)
    scale = max(g.abs().max().item() for g in one[2].values())
    for name, g in one[2].items():
        assert torch.allclose(grouped[2][name], g, rtol=1e-4, atol=1e-6 * scale), name


def test_padded_sizes_are_few_and_close_above():
    sizes = [padded_size(n) for n in range(1, 1 << 14)]
    assert all(n <= size <= n + n // 16 for n, size in enumerate(sizes, 1))
    assert sizes[:32] == list(range(1, 33))  # below 32 rows: every count its own
    for octave in range(5, 14):  # [2^k, 2^(k+1)): 2^k and 16 steps of 2^(k-4) above it
        low, step = 1 << octave, 1 << (octave - 4)
        assert {padded_size(n) for n in range(low, 2 * low)} == set(range(low, 2 * low + 1, step))
    assert padded_size(2200) == 2304


def test_rows_are_padded_on_a_cpu_in_bf16_only(tiny_data):
    """padded_size's rows pay where oneDNN builds a kernel per product shape (bf16 or fp16 products on a CPU):
    an fp32 model's decoder and encoder rows stop at the tokens, a bf16 model's (or under autocast) go on."""
    from qknorm_fairseq.encoder_rows import encoder_rows

    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder", "--packed-encoder")
    model.train()
    sample = train_sample(task)
    src, prev = sample["net_input"]["src_tokens"], sample["net_input"]["prev_output_tokens"]
    tokens = int(src.ne(task.src_dict.pad()).sum())
    assert padded_size(tokens) > tokens, tokens  # a count that padding changes
    assert not decoder_rows.pads_rows(model.decoder) and not decoder_rows.pads_rows(model.encoder)
    assert encoder_rows(model.encoder, src)["encoder_rows"][0].shape[0] == tokens
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert decoder_rows.pads_rows(model.decoder)
    model.bfloat16()
    assert decoder_rows.pads_rows(model.decoder) and decoder_rows.pads_rows(model.encoder)
    rows = Rows(prev, task.tgt_dict.pad(), 3, padded=True)
    assert rows.pad_rows == padded_size(len(rows.index)) - len(rows.index)
    assert encoder_rows(model.encoder, src)["encoder_rows"][0].shape[0] == padded_size(tokens)


def test_padding_rows_change_no_loss_and_no_gradient(tiny_data, monkeypatch):
    """The rows past the tokens (padded_size) pass through the layers' position-wise work only: the loss
    and gradients of a batch with seven of them are those without, and the logits the tokens' rows."""
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1)
    sample = train_sample(task)
    results = {}
    monkeypatch.setattr(decoder_rows, "pads_rows", lambda module: True)  # as in bf16 on a CPU
    for extra in (0, 7):
        monkeypatch.setattr(decoder_rows, "padded_size", lambda n, _extra=extra: n + _extra)
        assert Rows(sample["net_input"]["prev_output_tokens"], task.tgt_dict.pad(), 3, padded=True).pad_rows == extra
        tokens = int(sample["target"].ne(task.tgt_dict.pad()).sum())
        assert model(**sample["net_input"])[0].shape[0] == tokens
        results[extra] = _loss_and_grads(model, task, criterion, sample, True)
    assert results[7][:2] == pytest.approx(results[0][:2], rel=1e-6)
    scale = max(g.abs().max().item() for g in results[0][2].values())
    for name, g in results[0][2].items():
        assert torch.allclose(results[7][2][name], g, rtol=1e-5, atol=1e-7 * scale), name


def test_the_packed_decoder_refuses_a_prefix_it_cannot_ignore(tiny_data):
    # (--checkpoint-activations and --compile: test_encoder_rows.py, for both packed parts)
    model, task = build(tiny_data / "bin", "transformer_qknorm", *NO_DROPOUT, "--packed-decoder")
    model.train()
    criterion = MaskedLabelSmoothedCrossEntropyCriterion(task, sentence_avg=False, label_smoothing=0.1,
                                                         ignore_prefix_size=1)
    with pytest.raises(ValueError, match="--packed-decoder returns no .* --ignore-prefix-size"):
        criterion(model, train_sample(task))


def test_the_groups_gradients_are_those_of_the_per_group_ops_written_once():
    """Rows.grids, from_grids and split with gradients: the same values and gradients as each group's own
    index ops (grid, index_select, cat), summed by autograd, which the one-function backwards replace; the
    padding rows' gradient is zero."""
    tokens = torch.tensor([[5, 6, 1, 1, 1, 1, 1, 1], [7, 8, 9, 4, 4, 4, 4, 1], [3, 1, 1, 1, 1, 1, 1, 1],
                           [1, 1, 1, 5, 6, 7, 8, 9], [4] * 8])
    rows = Rows(tokens, pad=1, max_groups=3)
    rows.pad_rows = 3  # as padded_size gives on a CPU in bf16 for larger batches
    assert len(rows.groups) == 3
    g = torch.Generator().manual_seed(0)
    n = len(rows.index) + rows.pad_rows
    x0, source0 = torch.randn(n, 2, 3, generator=g), torch.randn(5, 2, 4, 3, generator=g)

    def per_group(x, source):
        grids = [group.grid(x) for group in rows.groups]
        sources = [source.index_select(0, group.sentences) for group in rows.groups]
        outs = [grid.matmul(s.transpose(-1, -2)).matmul(s) for grid, s in zip(grids, sources)]
        taken = [o.transpose(1, 2).reshape(-1, 6).index_select(0, group.local) for o, group in zip(outs, rows.groups)]
        return torch.cat([*taken, x.new_zeros(rows.pad_rows, 6)])

    def together(x, source):
        outs = [grid.matmul(s.transpose(-1, -2)).matmul(s) for grid, s in zip(rows.grids(x), rows.split(source))]
        return rows.from_grids(outs)

    results = []
    for f in (per_group, together):
        x, source = x0.clone().requires_grad_(), source0.clone().requires_grad_()
        y = f(x, source)
        y.backward(torch.arange(y.numel(), dtype=y.dtype).view_as(y).sin())
        results.append((y.detach(), x.grad, source.grad))
    for a, b in zip(*results):
        assert torch.allclose(a, b, atol=1e-6)
    assert results[1][1][-rows.pad_rows:].eq(0).all() and results[1][0][-rows.pad_rows:].eq(0).all()


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build csrc/grids.c")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_grids_c_copies_give_torchs_bits_forward_and_backward(dtype):
    """csrc/grids.c's gathers and scatters against the index ops they replace: the same values and
    gradients bit for bit (plain copies), zeros at the pads, in the layout the products read."""
    tokens = torch.tensor([[5, 6, 1, 1, 1, 1, 1, 1], [7, 8, 9, 4, 4, 4, 4, 1], [3, 1, 1, 1, 1, 1, 1, 1],
                           [1, 1, 1, 5, 6, 7, 8, 9], [4] * 8])
    rows = Rows(tokens, pad=1, max_groups=3)
    rows.pad_rows = 3
    assert decoder_rows._grids_library() is not None
    g = torch.Generator().manual_seed(0)
    n = len(rows.index) + rows.pad_rows
    x0, w0 = torch.randn(n, 4, 8, generator=g).to(dtype), torch.randn(4, 8, 8, generator=g).to(dtype)

    def run():
        x, w = x0.clone().requires_grad_(), w0.clone().requires_grad_()
        grids = rows.grids(x)
        y = rows.from_grids([grid.matmul(w) for grid in grids])
        y.backward(torch.arange(y.numel(), dtype=torch.float32).view_as(y).sin().to(dtype))
        return [grid.detach().contiguous() for grid in grids], y.detach(), x.grad, w.grad

    with native.enabled(False):
        want = run()
    got = run()
    assert all(grid.is_contiguous() for grid in rows.grids(x0))  # the products' layout, no copy before them
    for a, b in zip([*got[0], *got[1:]], [*want[0], *want[1:]]):
        assert a.dtype == dtype and torch.equal(a, b)
    for grid, group in zip(got[0], rows.groups):
        pads = torch.arange(group.length)[None, :] >= torch.from_numpy(group.lengths)[:, None]
        assert grid.transpose(1, 2)[pads].eq(0).all()


@pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build csrc/l2_normalize.c")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_qknorms_l2_loop_into_the_grids_gives_the_unfused_bits(dtype):
    """QKNorm's queries normalised straight into the grids, times g (fused_kernels.l2_grids), against the
    l2 loop, the grids' copies and the product with g they replace: the same grids and x's gradient bit for
    bit (a floored row among them), the padding rows' gradient zero; g's gradient, which the C loop sums in
    fp32 where torch's ops sum rounded products, to a bf16's precision."""
    from qknorm_fairseq import fused_kernels
    from qknorm_fairseq.attention import EPS

    tokens = torch.tensor([[5, 6, 1, 1, 1, 1, 1, 1], [7, 8, 9, 4, 4, 4, 4, 1], [3, 1, 1, 1, 1, 1, 1, 1],
                           [1, 1, 1, 5, 6, 7, 8, 9], [4] * 8])
    rows = Rows(tokens, pad=1, max_groups=3)
    rows.pad_rows = 3
    gen = torch.Generator().manual_seed(0)
    n = len(rows.index) + rows.pad_rows
    x0, w0 = torch.randn(n, 4, 8, generator=gen).to(dtype), torch.randn(4, 8, 8, generator=gen).to(dtype)
    x0[2, 1] = 0  # a row whose norm is floored
    g0 = torch.tensor(2.5, dtype=dtype)

    def run(fused, with_g):
        x, w, g = x0.clone().requires_grad_(), w0.clone().requires_grad_(), g0.clone().requires_grad_()
        if fused:
            grids = fused_kernels.l2_grids(x, rows, EPS, g if with_g else None)
        else:
            grids = rows.grids(fused_kernels.lp_normalize(x, 2.0, EPS))
            grids = [grid * g for grid in grids] if with_g else grids
        y = rows.from_grids([grid.matmul(w) for grid in grids])
        y.backward(torch.arange(y.numel(), dtype=torch.float32).view_as(y).sin().to(dtype))
        return [grid.detach() for grid in grids], x.grad, w.grad, g.grad

    for with_g in (True, False):
        got, want = run(True, with_g), run(False, with_g)
        assert len(got[0]) == len(rows.groups) == 3
        for a, b in zip([*got[0], got[1], got[2]], [*want[0], want[1], want[2]]):
            assert a.dtype == dtype and torch.equal(a, b)
        assert got[1][-rows.pad_rows:].eq(0).all()
        if with_g:
            assert got[3].dtype == dtype and float(got[3]) == pytest.approx(float(want[3]), rel=2 ** -7)
        else:
            assert got[3] is None and want[3] is None
