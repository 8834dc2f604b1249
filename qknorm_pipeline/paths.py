"""Paths as they go into shareable results: relative to the repository, never this machine's."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shareable(path):
    """`path` relative to the repository when it lies inside it; anything else unchanged."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path


def cpu_name():
    """This machine's CPU model as results report it (/proc/cpuinfo, else platform's guess)."""
    import platform

    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")),
                        platform.processor() or platform.machine())
    except OSError:
        return platform.processor() or platform.machine()
