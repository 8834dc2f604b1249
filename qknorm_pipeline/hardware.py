"""The machine, as the tools need it and as results name it: the CPU's model and flags, whether it
multiplies bf16 natively and how fast, the CUDA devices torch sees, torch's CPU kernels, and the
labels a record carries: the `machine:` line of a training log (`machine`, which study/records.py
parses back), a throughput record's device (`device_name`) and a speed benchmark's machine fields
(`machine_info`).

torch is imported only by the facts that need it; has_gpu, gpu_count and cpu_bf16_speedup ask a
child process, so that train.sh's checks before a run do not import torch themselves.
"""
import os
import platform
import subprocess
import sys

from .cli import UserError

BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86-64 AVX512-BF16 / AMX; aarch64 BF16


def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read().splitlines()
    except OSError:
        return []


def cpu_name():
    """The CPU's model as results report it (/proc/cpuinfo, else platform's guess)."""
    return next((line.split(":", 1)[1].strip() for line in _cpuinfo() if line.startswith("model name")),
                platform.processor() or platform.machine())


def cpu_flags():
    """The CPU's feature flags (/proc/cpuinfo's flags, or Features on ARM); empty where unreadable."""
    return {w for line in _cpuinfo() if line.startswith(("flags", "Features")) for w in line.split(":", 1)[1].split()}


def cpu_has_bf16():
    """The CPU multiplies bf16 natively; without it torch emulates bf16, slower than fp32."""
    return any(f in cpu_flags() for f in BF16_FLAGS)


# fp32 time / bf16 time of one matrix product of the gl-en study's shapes, best of ten each: native
# bf16 instructions do not make bf16 fast on every CPU (docs/gpu.md has the measurements)
BF16_PROBE = """
import time, torch
a, b = torch.randn(4096, 256), torch.randn(256, 1024)
def best(x, y):
    for _ in range(3):
        x @ y
    times = []
    for _ in range(10):
        t = time.perf_counter()
        x @ y
        times.append(time.perf_counter() - t)
    return min(times)
print(best(a, b) / best(a.bfloat16(), b.bfloat16()))
"""
_BF16 = {}


def cpu_bf16_speedup(env=None):
    """BF16_PROBE's ratio on this CPU (above 1: bf16 is the faster), measured once per process in a
    child process with the run's environment ENV (its threads)."""
    if "speedup" not in _BF16:
        out = subprocess.run([sys.executable, "-c", BF16_PROBE], capture_output=True, text=True, env=env)
        if out.returncode != 0:
            why = (out.stderr.strip().splitlines() or ["?"])[-1]
            raise UserError(f"--precision bf16: the bf16 speed probe failed ({why}); check that torch imports, "
                            "or train in fp32 (drop --precision)")
        _BF16["speedup"] = float(out.stdout)
    return _BF16["speedup"]


_GPU = {}


def has_gpu():
    """torch sees a CUDA device (asked once, in a child process)."""
    if "any" not in _GPU:
        code = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"
        _GPU["any"] = subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
    return _GPU["any"]


def gpu_count():
    """How many CUDA devices torch sees (asked in a child process)."""
    code = "import torch; print(torch.cuda.device_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip()
    return int(out or 0)


def gpu_name():
    """The first CUDA device's name (torch imported here)."""
    import torch

    return torch.cuda.get_device_name(0)


def cpu_kernels():
    """The CPU kernels torch dispatches to (AVX2, AVX512, ...)."""
    import torch

    return torch.backends.cpu.get_cpu_capability()


def machine(gpu=False):
    """This machine as a training log names it: its CPU, core count, system, and torch's threads and
    CPU kernels; with GPU, the CUDA devices torch sees first (none: the CPU's line alone)."""
    line = f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    try:
        import torch
    except ImportError:
        return line
    line += f"; torch {torch.__version__}, {torch.get_num_threads()} threads, {cpu_kernels()} kernels"
    if gpu and torch.cuda.is_available():
        n = torch.cuda.device_count()
        line = f"{gpu_name()}{f' x{n}' if n > 1 else ''}; {line}"
    return line


def device_name(gpu):
    """The device a throughput or validation record was measured on: the GPU's name, or the CPU's
    with its core count ("AMD EPYC (2 cores)")."""
    return gpu_name() if gpu else f"{cpu_name()} ({os.cpu_count()} cores)"


def machine_info(device, dtype):
    """A speed benchmark's machine fields: the platform, CPU, threads, the versions it ran with, and
    on DEVICE cuda the GPU and CUDA version."""
    import fairseq
    import torch

    info = {"platform": platform.platform(), "cpu": cpu_name(), "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": sys.version.split()[0],
            "torch": torch.__version__, "fairseq": fairseq.__version__, "device": device, "dtype": dtype,
            "load_average_start": list(os.getloadavg())}
    if device.startswith("cuda"):
        info["gpu"] = gpu_name()
        info["cuda"] = torch.version.cuda
    return info
