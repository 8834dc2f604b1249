"""Paths as they go into shareable results: relative to the repository, never this machine's."""
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def shareable(path):
    """`path` relative to the repository when it lies inside it; anything else unchanged."""
    full = os.path.abspath(path)
    return os.path.relpath(full, ROOT) if full.startswith(ROOT + os.sep) else path
