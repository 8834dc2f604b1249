"""A finished run exits cleanly: fairseq's batch-prefetch thread is stopped before the interpreter
ends it inside a torch op (SIGABRT, "terminate called without an active exception")."""
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from helpers import REPO, environment, train_args

# fairseq's BufferedIterator over batches that take long to make: the prefetch thread is inside a
# torch op whenever the main thread exits; argv[1] "fairseq" puts fairseq's own thread back
EXIT_WHILE_PREFETCHING = """
import sys, torch
from fairseq.data import iterators
from qknorm_fairseq import clean_exit
if sys.argv[1] == "fairseq":
    iterators.BackgroundConsumer = clean_exit.FairseqConsumer

class SlowBatches:
    def __len__(self):
        return 100

    def __iter__(self):
        a = torch.randn(300, 300)
        for i in range(100):
            for _ in range(200):
                a = torch.mm(a, a).clamp_(-1, 1)
            yield i

print(next(iterators.BufferedIterator(2, SlowBatches())))
"""


def exit_while_prefetching(consumer):
    return subprocess.run([sys.executable, "-c", EXIT_WHILE_PREFETCHING, consumer], cwd=REPO, env=environment(),
                          capture_output=True, text=True)


@pytest.mark.skipif(sys.version_info >= (3, 14), reason="Python >= 3.14 no longer ends daemon threads at exit")
def test_fairseq_prefetch_thread_aborts_at_exit():
    """The cause, shown: with fairseq's own thread the process aborts after its work is done."""
    proc = exit_while_prefetching("fairseq")
    assert proc.stdout == "0\n"
    assert proc.returncode != 0 and "terminate called without an active exception" in proc.stderr


def test_exit_while_prefetching_is_clean_every_time():
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(exit_while_prefetching, ["ours"] * 8))
    for proc in procs:
        assert (proc.returncode, proc.stdout) == (0, "0\n"), proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr


def test_training_leaves_no_prefetch_thread(tiny_data, tmp_path):
    """Our fairseq-train entry point, stopped by --max-update in the middle of an epoch (the thread
    still prefetching), with no checkpoint and no validation: the exit path of the CI abort."""
    script = (
        "import sys, threading\n"
        "from qknorm_pipeline import fairseq_train\n"
        "from qknorm_fairseq import clean_exit\n"
        "fairseq_train.main()\n"
        "clean_exit.stop_consumers()\n"
        "print('alive', sum(isinstance(t, clean_exit.FairseqConsumer) and t.is_alive() for t in threading.enumerate()))\n")
    args = train_args(tiny_data / "bin", tmp_path, "qknorm_transformer", "--max-update", "3", "--max-tokens", "200",
                      "--disable-validation", "--no-save", "--log-format", "json", "--cpu")
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script, *map(str, args)], cwd=REPO, env=environment(),
                              capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert '"train_num_updates": "3"' in proc.stdout + proc.stderr
        assert proc.stdout.strip().endswith("alive 0")
