"""qknorm_fairseq/native.py's build of the C kernels, and --fast-dropout's kernels (csrc/fast_dropout.c)
against numpy's generator and the torch ops they replace, bit for bit (--fused-adam's csrc/flat_adam.c:
tests/unit/test_optimizer.py and test_fast_step.py)."""
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from qknorm_fairseq import fast_dropout, native
from qknorm_fairseq.fast_dropout import FastDropout

needs_library = pytest.mark.skipif(native.compiler() is None, reason="no C compiler on PATH to build the kernels")


@pytest.fixture
def fresh_build(tmp_path, monkeypatch):
    """An empty kernel cache and no library loaded yet, restored afterwards."""
    monkeypatch.setenv("QKNORM_CACHE", str(tmp_path / "cache"))
    native.forget()
    yield tmp_path / "cache"
    native.forget()


@needs_library
def test_a_kernel_is_built_once_per_source_and_cpu_and_kept(fresh_build, monkeypatch):
    lib = native.load("fast_dropout")
    built = list(fresh_build.glob("fast_dropout-*.so"))
    assert len(built) == 1 and lib._name == str(built[0])
    stamp = built[0].stat().st_mtime_ns
    native.load.cache_clear()
    native.load("fast_dropout")
    assert built[0].stat().st_mtime_ns == stamp  # reused, not rebuilt
    monkeypatch.setattr(native, "_cpu", lambda: "flags : avx2 (another machine)")
    native.load.cache_clear()
    native.load("fast_dropout")
    assert len(list(fresh_build.glob("fast_dropout-*.so"))) == 2  # -march=native: a build per CPU
    assert not list(fresh_build.glob(".*"))  # no partial file left


@needs_library
def test_a_header_the_source_includes_is_part_of_its_build(fresh_build, tmp_path, monkeypatch):
    (tmp_path / "k.c").write_text('#include "k.h"\nint k(void) { return K; }\n')
    monkeypatch.setattr(native, "SOURCES", tmp_path)
    for value in (1, 2):
        (tmp_path / "k.h").write_text(f"#define K {value}\n")
        native.load.cache_clear()
        assert native.load("k").k() == value
    assert len(list(fresh_build.glob("k-*.so"))) == 2


def test_no_compiler_is_one_line_and_dropout_falls_back_to_torchs_ops_with_a_warning(fresh_build, monkeypatch, caplog):
    monkeypatch.setenv("CC", "no-such-compiler-qk")
    with pytest.raises(native.NativeError, match=r"^no C compiler \(\$CC or cc, gcc, clang\) on PATH to build "
                                                 r"fast_dropout\.c$"):
        native.load("fast_dropout")
    x = torch.randn(300, 40)
    with caplog.at_level(logging.WARNING, logger="qknorm_fairseq.native"):
        torch.manual_seed(2)
        y = fast_dropout.fast_dropout(x, 0.3)
    assert fast_dropout.library() is None
    assert any("--fast-dropout: no C compiler" in r.message and "torch's ops instead" in r.message for r in caplog.records)
    torch.manual_seed(2)
    assert torch.equal(y, x * fast_dropout.keep_mask(x.shape, 0.7, x.dtype))


@needs_library
def test_a_source_that_does_not_compile_names_the_compiler_and_the_error(fresh_build, tmp_path, monkeypatch):
    (tmp_path / "broken.c").write_text("int f(void) { return undeclared_name; }\n")
    monkeypatch.setattr(native, "SOURCES", tmp_path)
    with pytest.raises(native.NativeError, match=r"could not build broken\.c: .*undeclared_name"):
        native.load("broken")
    assert not list(fresh_build.glob("*broken*")) and not list(fresh_build.glob(".*"))


@needs_library
@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_kernels_draw_numpys_pcg64dxsm_stream_split_across_threads(threads):
    lib = fast_dropout.library()
    seed = 123456789
    for n in (1, 5, 1023, 1024, 1025, 4097, 300_001):
        words = np.random.PCG64DXSM(seed).random_raw((n + 3) // 4)
        expected = torch.frombuffer(words, dtype=torch.int16)[:n]
        state = np.random.PCG64DXSM(seed).state["state"]
        out = torch.empty(n, dtype=torch.int16)
        lib.qk_draws(out.data_ptr(), n, state["state"] >> 64, state["state"] & (2**64 - 1), state["inc"] >> 64,
                     state["inc"] & (2**64 - 1), threads)
        assert torch.equal(out, expected), n


@needs_library
def test_the_streams_state_for_a_seed_is_numpys_seeding_of_pcg64dxsm(monkeypatch):
    # seeds of one and two 32-bit words, 0, and the largest _seed draws; then generator_state itself
    seeds = [0, 1, 2**31, 2**32 - 1, 2**32, 2**62 - 1, *np.random.default_rng(5).integers(0, 2**62, 200).tolist()]
    for seed in seeds:
        state = np.random.PCG64DXSM(seed).state["state"]
        expected = (state["state"] >> 64, state["state"] & (2**64 - 1), state["inc"] >> 64, state["inc"] & (2**64 - 1))
        monkeypatch.setattr(fast_dropout, "_seed", lambda seed=seed: seed)
        assert fast_dropout.generator_state() == expected, seed


def _run(pattern, x, r, dy, native_on, threads):
    drop = FastDropout(0.3)
    xs, rs = x.clone().requires_grad_(), r.clone().requires_grad_()
    torch.set_num_threads(threads)
    torch.manual_seed(4)
    with native.enabled(native_on):
        y = drop.relu(xs) if pattern == "relu" else drop.add(xs, rs) if pattern == "add" else drop(xs)
        y.backward(dy)
    return y.detach(), xs.grad, rs.grad


@needs_library
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", ["dropout", "add", "relu"])
def test_each_pattern_is_the_torch_ops_bit_for_bit_forward_and_backward(dtype, pattern):
    """The C loop against --fast-dropout's torch ops on the same seed: outputs and gradients as the
    same bits, on one thread and on two (a tensor above torch's grain of 32,768 elements is split),
    with negative zeros, infinities and NaN among the inputs (ReLU's: not +inf or NaN, whose NaN
    output, where the unit was dropped, has gradient 0 there and grad / keep here: fairseq stops such
    a run at its finite-gradient check either way)."""
    before = torch.get_num_threads()
    g = torch.Generator().manual_seed(0)
    specials = [-0.0, -float("inf")] + ([] if pattern == "relu" else [float("inf"), float("nan")])
    try:
        for shape, threads in (((37, 24), 1), ((3, 5, 7), 1), ((300, 400), 2), ((70_001,), 2)):
            x, r, dy = (torch.randn(shape, generator=g).mul(3).to(dtype) for _ in range(3))
            x.view(-1)[:len(specials)] = torch.tensor(specials)
            ours, theirs = (_run(pattern, x, r, dy, on, threads) for on in (True, False))
            for a, b in zip(ours, theirs):
                if b is None:
                    assert a is None
                    continue
                bits = torch.int16 if dtype == torch.bfloat16 else torch.int32
                # -0 and +0 (relu of -0, a product with a dropped unit) compare equal as values
                same = (a.view(bits) == b.view(bits)) | (a == b) | (a.isnan() & b.isnan())
                assert same.all(), (shape, (~same).sum())
            if x.numel() > 10_000:  # the kept share, from the gradient: keep 0.7, after ReLU half that
                share = (ours[1] != 0).float().mean()
                assert (0.33 < share < 0.37) if pattern == "relu" else (0.68 < share < 0.72), share
    finally:
        torch.set_num_threads(before)


@needs_library
def test_the_c_path_keeps_a_byte_per_unit_and_its_inputs_decide_it():
    x = torch.randn(64, 32, requires_grad=True)
    y = FastDropout(0.3)(x)
    assert [t.dtype for t in y.grad_fn.saved_tensors] == [torch.uint8]
    y = FastDropout(0.3).relu(x)
    assert [t.dtype for t in y.grad_fn.saved_tensors] == [torch.float32]  # the output only, no mask
    # a transposed view, a float64 tensor and mixed dtypes go through torch's ops
    for a, b in ((x.t(), None), (x.double(), None), (x, torch.randn(64, 32).bfloat16())):
        assert not fast_dropout._native(a, *([b] if b is not None else []))
    assert fast_dropout._native(x, torch.randn(64, 32))
    with native.enabled(False):
        assert not fast_dropout._native(x)


def test_torch_compiles_cache_is_a_directory_per_cpu_and_vector_isa(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    here = native.inductor_cache()
    assert Path(here).parent == tmp_path and Path(here).name.startswith("cpu-")
    assert native.inductor_cache() == here  # set once: a second call (or a child process) keeps it
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    narrower = native.inductor_cache()
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("ATEN_CPU_CAPABILITY")
    monkeypatch.setattr(native, "_cpu", lambda: "flags : avx2 (another machine)")
    other = native.inductor_cache()
    assert len({here, narrower, other}) == 3 and all(Path(d).parent == tmp_path for d in (narrower, other))


def test_without_a_cache_directory_set_inductors_default_gets_the_cpus_subdirectory(monkeypatch):
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "")  # restored afterwards, whatever inductor_cache() sets
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert Path(native.inductor_cache()).parent == Path(default_cache_dir())
