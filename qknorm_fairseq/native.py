"""C kernels of csrc/, compiled for this machine on first use and loaded with ctypes.

A kernel is built by the C compiler on PATH ($CC, else cc, gcc or clang) with -march=native and
OpenMP, once per source, compiler and CPU: the library is kept under $QKNORM_CACHE (default
~/.cache/qknorm_fairseq) with a name that hashes all three, so a checkout on a machine with other
instruction sets builds its own. No torch headers are needed, so a build takes a fraction of a second.

torch.compile's cache (Inductor's, --fused-kernels' loops and --compile's layers) gets the same rule:
its key names no CPU, so code it generated for one machine's vector width (AVX2: 8 floats a vector)
is loaded on another's (AVX-512: 16) and compiled there with that machine's flags, where it reads and
writes past its buffers (torch 2.13: NaN losses, then "double free or corruption"). A cache directory
shared by machines with different CPUs (a home directory or a /tmp that outlives the machine) meets
it; inductor_cache() gives each CPU its own subdirectory.
"""
import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
from pathlib import Path

import torch

SOURCES = Path(__file__).parent / "csrc"
# -ffp-contract=off: no fused multiply-add, so a product and a sum round as torch's ops round them;
# -fno-math-errno: sqrtf vectorised (it sets no errno, the only difference); -mprefer-vector-width=512: the
# compiler's own vectorisation 16 fp32 lanes wide where the CPU has AVX-512 (gcc picks 256 bits otherwise;
# the same bits, since no sum is reordered; docs/performance.md, "And QKNorm's l2 loops?")
FLAGS = ("-O3", "-march=native", "-mprefer-vector-width=512", "-ffp-contract=off", "-fno-math-errno", "-fopenmp",
         "-shared", "-fPIC")
COMPILERS = ("cc", "gcc", "clang")


logger = logging.getLogger(__name__)

DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # the codes of csrc/common.h


def threads(n):
    """The threads for a loop over N elements: torch's, from at::internal::GRAIN_SIZE up, as torch's own loops."""
    return torch.get_num_threads() if n >= 32768 else 1


class NativeError(RuntimeError):
    pass


def cache_dir():
    default = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "qknorm_fairseq"
    return Path(os.environ.get("QKNORM_CACHE") or default)


def compiler():
    """The C compiler's path: $CC, else the first of COMPILERS on PATH, else None."""
    names = [os.environ["CC"]] if os.environ.get("CC") else COMPILERS
    return next(filter(None, map(shutil.which, names)), None)


def _cpu():
    try:
        with open("/proc/cpuinfo") as f:
            return next((line for line in f if line.startswith("flags")), "")
    except OSError:
        return platform.processor()


def cpu_flags():
    """This CPU's instruction-set flags (/proc/cpuinfo's; none where it cannot be read)."""
    line = _cpu()
    return line.split(":", 1)[1].split() if line.startswith("flags") else []


def inductor_cache():
    """Point torch.compile's cache (TORCHINDUCTOR_CACHE_DIR: the user's, else Inductor's default) at a
    subdirectory for this CPU and vector ISA (ATEN_CPU_CAPABILITY, which Inductor honours too); the
    directory, set once per process and inherited by its compile workers."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    base = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir()
    key = hashlib.sha1(f"{_cpu()}\0{os.environ.get('ATEN_CPU_CAPABILITY', '')}".encode()).hexdigest()[:12]
    name = f"cpu-{key}"
    if Path(base).name != name:  # a process started by one that has set it already keeps it
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(Path(base) / name)
    return os.environ["TORCHINDUCTOR_CACHE_DIR"]


@functools.cache
def load(name, portable=False):
    """The ctypes library built from csrc/NAME.c; NativeError (one line) where it cannot be built.
    PORTABLE: built without the AVX-512 forms of its loops (csrc/simd.h), which must give the same bits
    (tests compare the two)."""
    source = SOURCES / f"{name}.c"
    flags = (*FLAGS, "-DQK_PORTABLE") if portable else FLAGS
    cc = compiler()
    if cc is None:
        raise NativeError(f"no C compiler ($CC or {', '.join(COMPILERS)}) on PATH to build {source.name}")
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout
    texts = [source.read_text(), *(h.read_text() for h in sorted(SOURCES.glob("*.h")))]  # the headers it may include
    key = hashlib.sha1(b"\0".join(s.encode() for s in (*texts, " ".join(flags), version, _cpu())))
    lib = cache_dir() / f"{name}-{key.hexdigest()[:16]}.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        partial = lib.with_name(f".{lib.name}.{os.getpid()}")
        built = subprocess.run([cc, *flags, str(source), "-o", str(partial)], capture_output=True, text=True)
        if built.returncode:
            partial.unlink(missing_ok=True)
            first = next((line for line in built.stderr.splitlines() if "error" in line), built.stderr.strip()[:200])
            raise NativeError(f"{cc} could not build {source.name}: {first}")
        os.replace(partial, lib)  # atomic: a process beside this one loads a whole library or builds its own
    return ctypes.CDLL(str(lib))


def pointer(t):
    """T's data pointer for a C kernel, None (NULL) for no tensor."""
    return None if t is None else t.data_ptr()


_kernels = {}  # (name, portable) -> the library with its signatures set, or None: what kernels() returned
_portable = False


def kernels(name, signatures, flag, instead):
    """load(NAME) with each function's (argtypes, restype) from SIGNATURES (within portable_loops(), its
    portable build); where it cannot be built, None, and one warning naming FLAG and what runs INSTEAD."""
    key = (name, _portable)
    if key not in _kernels:
        try:
            lib = load(name, portable=_portable)
            for function, (args, result) in signatures.items():
                getattr(lib, function).argtypes, getattr(lib, function).restype = args, result
        except NativeError as e:
            logger.warning(f"{flag}: {e}; {instead} (docs/performance.md)")
            lib = None
        _kernels[key] = lib
    return _kernels[key]


@contextlib.contextmanager
def portable_loops():
    """Within it, the C kernels are their portable builds (load's PORTABLE): how the benchmark times the
    AVX-512 loops against them."""
    global _portable
    before, _portable = _portable, True
    try:
        yield
    finally:
        _portable = before


def forget():
    """Every library loaded or refused so far forgotten: the next use builds or loads again (tests)."""
    load.cache_clear()
    _kernels.clear()


_enabled = True


@contextlib.contextmanager
def enabled(on):
    """Within it, the C kernels are used (where built) or not: how tests and benchmarks compare them."""
    global _enabled
    before, _enabled = _enabled, on
    try:
        yield
    finally:
        _enabled = before


def is_enabled():
    """Whether the C kernels may run: not switched off, and not inside torch.compile's tracing, which
    cannot trace a ctypes call (the torch ops it replaces are traced instead)."""
    return _enabled and not getattr(torch.compiler, "is_compiling", lambda: False)()
