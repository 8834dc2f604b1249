"""Where things are: the repository, the output folders (each movable by an environment variable),
and paths as they go into shareable results (relative to the repository, never this machine's)."""
import dataclasses
import os
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_DIR = os.path.join(ROOT, "qknorm_fairseq")  # the plugin, given to fairseq as --user-dir
CONFIG_DIR = os.environ.get("QKNORM_CONFIG_DIR", os.path.join(ROOT, "configs"))


@dataclasses.dataclass(frozen=True)
class Folders:
    """downloads and tokenized text, binarized data, checkpoints, training logs, results."""

    data: str
    data_bin: str
    ckpt: str
    logs: str
    results: str

    def under(self, name):
        """The same folders, each with a subfolder NAME (a study keeps its runs apart this way)."""
        return Folders(*(os.path.join(p, name) for p in dataclasses.astuple(self)))


def folders():
    """$DATA_DIR (data/), $DATA_BIN (data-bin/), $CKPT_DIR (checkpoints/), $LOG_DIR (logs/),
    $RESULTS_DIR (results/), each relative to the repository unless the variable is set."""
    def get(var, default):
        return os.path.abspath(os.environ.get(var) or os.path.join(ROOT, default))

    return Folders(get("DATA_DIR", "data"), get("DATA_BIN", "data-bin"), get("CKPT_DIR", "checkpoints"),
                   get("LOG_DIR", "logs"), get("RESULTS_DIR", "results"))


def shareable(path):
    """`path` relative to the repository when it lies inside it; anything else unchanged."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def shareable_text(text):
    """TEXT (a log) without this machine's paths: the repository's made relative to it, then (a
    traceback's frames) installed packages' as $SITE, the standard library's as $STDLIB, the home
    folder's as ~; the longest prefix first, since site-packages often lies inside the stdlib's."""
    text = text.replace(ROOT + os.sep, "")
    prefixes = {sysconfig.get_path("purelib"): "$SITE", sysconfig.get_path("platlib"): "$SITE",
                sysconfig.get_path("stdlib"): "$STDLIB", os.path.expanduser("~"): "~"}
    for prefix in sorted(prefixes, key=len, reverse=True):
        if len(prefix) > 1:
            text = text.replace(prefix + os.sep, prefixes[prefix] + os.sep)
    return text


def short(path):
    """PATH as a user reads it: relative to the current folder when inside it."""
    full, here = os.path.abspath(path), os.getcwd()
    return os.path.relpath(full, here) if full.startswith(here + os.sep) else path


def cpu_name():
    """This machine's CPU model as results report it (/proc/cpuinfo, else platform's guess)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:
        return platform.processor() or platform.machine()


def machine(gpu=False):
    """This machine as results name it: its CPU, core count, system, and torch's threads and CPU
    kernels; with GPU, the CUDA devices torch sees first (none: the CPU's line alone)."""
    import platform

    line = f"{cpu_name()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}"
    try:
        import torch
    except ImportError:
        return line
    line += f"; torch {torch.__version__}, {torch.get_num_threads()} threads, " \
            f"{torch.backends.cpu.get_cpu_capability()} kernels"
    if gpu and torch.cuda.is_available():
        n = torch.cuda.device_count()
        line = f"{torch.cuda.get_device_name(0)}{f' x{n}' if n > 1 else ''}; {line}"
    return line


BF16_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")  # x86-64 AVX512-BF16 / AMX; aarch64 BF16


def cpu_has_bf16():
    """This CPU multiplies bf16 natively (/proc/cpuinfo flags); without it torch emulates bf16,
    slower than fp32."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = {w for line in f if line.startswith(("flags", "Features")) for w in line.split(":", 1)[1].split()}
    except OSError:
        return False
    return any(f in flags for f in BF16_FLAGS)
