"""The memory allocator of CPU training: tcmalloc (or jemalloc) in place of glibc's malloc.

An update allocates and frees hundreds of tensors of a few KB to tens of MB, each with
posix_memalign. glibc's malloc splits and sorts its free chunks at each of those calls: in a
profile of the study's step, a seventh of the main thread's time was glibc's _int_malloc. tcmalloc
and jemalloc keep freed blocks by size and hand them back whole, and the update runs about 1.3x
faster, stock fairseq's too (docs/performance.md, "And the memory allocator?"). An allocator only
places tensors in memory; a run's results are the same bits under each.

A library replaces malloc only when the dynamic linker loads it first (LD_PRELOAD), so the training
entry points start their own process again, once, with LD_PRELOAD set. QKNORM_MALLOC chooses:
  auto (default)      tcmalloc where one is found, else jemalloc, else glibc's malloc (the log says so)
  tcmalloc, jemalloc  that one; an error where it is not found
  system              glibc's malloc
  /path/to/lib.so     that library
An allocator already preloaded (the user's own LD_PRELOAD) is kept. Only CPU runs (--cpu) on Linux
change allocator; GPU runs keep the system's. evaluate.sh's fairseq-generate on a CPU gets the same
allocator through its environment: its beam search decoded the study's test set 5.9x faster.
"""
import os
import sys

VAR = "QKNORM_MALLOC"
CHOICES = ("auto", "tcmalloc", "jemalloc", "system")
STARTED = "QKNORM_MALLOC_STARTED"  # set for the second start: a preload that did not load is an error, not a loop
LIBRARIES = {"tcmalloc": ("libtcmalloc_minimal.so.4", "libtcmalloc.so.4", "libtcmalloc_minimal.so", "libtcmalloc.so"),
             "jemalloc": ("libjemalloc.so.2", "libjemalloc.so")}
# PyTorch's own CPU launcher (torch.backends.xeon.run_cpu) sets the first three; without the last two,
# jemalloc hands freed pages back to the kernel and faults them in again (3.1 against 3.65 updates/s)
JEMALLOC_CONF = "oversize_threshold:1,background_thread:true,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1"
LOG = "memory allocator: "  # the train log's line (describe), which the benchmark reads back
MISSING = "no tcmalloc or jemalloc was found, and CPU training runs about 1.3x faster with one, decoding about 6x"
INSTALL = ("apt install libtcmalloc-minimal4 on Debian and Ubuntu, dnf install gperftools-libs on Fedora, "
           "conda install -c conda-forge gperftools")
SYSTEM_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib",
               "/usr/local/lib64")


def search_dirs(environ=os.environ):
    """Where the libraries are looked for: LD_LIBRARY_PATH, the active conda environment's and this
    Python's lib/, then the system's library folders."""
    dirs = [d for d in environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    dirs += [os.path.join(p, "lib") for p in (environ.get("CONDA_PREFIX"), sys.prefix) if p]
    return dirs + list(SYSTEM_DIRS)


def find(name, dirs):
    """The path of allocator NAME's library in the first of DIRS that holds one, or None."""
    return next((os.path.join(d, lib) for d in dirs for lib in LIBRARIES[name] if os.path.isfile(os.path.join(d, lib))),
                None)


def name_of(path):
    base = os.path.basename(path)
    return next((name for name in LIBRARIES if name in base), base)


def label(choice):
    """How logs name the allocator of CHOICE (a name resolve returns, or a library's path)."""
    return "glibc's malloc" if choice == "system" else name_of(choice)


def resolve(choice, dirs):
    """(name, path) of the allocator CHOICE (a QKNORM_MALLOC value) picks; (\"system\", None) for
    glibc's malloc. ValueError, with the fix, for a choice that cannot be had."""
    if choice == "system":
        return "system", None
    if choice == "auto":
        return next(((name, find(name, dirs)) for name in LIBRARIES if find(name, dirs)), ("system", None))
    if choice in LIBRARIES:
        path = find(choice, dirs)
        if path is None:
            raise ValueError(f"{VAR}={choice}: no {choice} library ({', '.join(LIBRARIES[choice])}) in "
                             f"{', '.join(dirs)}; install it ({INSTALL}), or set {VAR}=system")
        return choice, path
    if os.sep in choice:
        if not os.path.isfile(choice):
            raise ValueError(f"{VAR}={choice}: no such file; give the path of an allocator's shared library, "
                             f"or one of {', '.join(CHOICES)}")
        return name_of(choice), choice
    raise ValueError(f"{VAR}={choice}: give one of {', '.join(CHOICES)}, or the path of an allocator's shared library")


def loaded(maps="/proc/self/maps"):
    """The path of the tcmalloc or jemalloc library mapped into this process, or None."""
    try:
        with open(maps) as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    paths = (line.split(None, 5)[5] for line in lines if len(line.split(None, 5)) == 6)
    return next((p for p in paths if name_of(p) in LIBRARIES), None)


def applies(argv):
    return "--cpu" in argv and sys.platform.startswith("linux")


def restart_with_allocator(argv, environ=os.environ, execve=os.execve, dirs=None):
    """Start this process's command line again with QKNORM_MALLOC's allocator preloaded, when ARGV
    (fairseq-train's arguments) is a CPU run and that allocator is not in place yet; else return.
    ValueError for a choice that cannot be had, or a preload that did not load."""
    if not applies(argv) or loaded():
        return
    name, path = resolve(environ.get(VAR, "auto"), search_dirs(environ) if dirs is None else dirs)
    if path is None:
        return
    if environ.get(STARTED):
        raise ValueError(f"{VAR}: LD_PRELOAD={path} did not load it (the dynamic linker's message is above); "
                         f"name a library built for this machine, or set {VAR}=system")
    execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], dict(preload(environ, name, path), **{STARTED: path}))


def preload(environ, name, path):
    """ENVIRON with PATH (allocator NAME's library) first in LD_PRELOAD."""
    env = dict(environ, LD_PRELOAD=os.pathsep.join(filter(None, (path, environ.get("LD_PRELOAD")))))
    if name == "jemalloc":
        env.setdefault("MALLOC_CONF", JEMALLOC_CONF)
    return env


def for_child(environ=os.environ):
    """(environment, allocator's name) of a CPU tool this process starts (fairseq-generate): ENVIRON
    with QKNORM_MALLOC's library preloaded, or as it is under glibc's malloc ("system") or an
    allocator the user preloaded. ValueError as resolve's."""
    given = [p for p in environ.get("LD_PRELOAD", "").split(os.pathsep) if name_of(p) in LIBRARIES]
    if given:
        return dict(environ), name_of(given[0])
    if not sys.platform.startswith("linux"):
        return dict(environ), "system"
    name, path = resolve(environ.get(VAR, "auto"), search_dirs(environ))
    return (dict(environ) if path is None else preload(environ, name, path)), name


def describe(environ=os.environ):
    """(the log's line on the allocator in place, whether it is a warning)."""
    path = loaded()
    if path:
        return f"{LOG}{label(path)} ({path})", False
    if environ.get(VAR) == "system":
        return f"{LOG}{label('system')} ({VAR}=system)", False
    return f"{LOG}{label('system')}; {MISSING}: {INSTALL} (docs/performance.md)", True
