"""fairseq's batch-prefetch thread, stopped before the interpreter exits.

fairseq's BufferedIterator (--data-buffer-size, default 10) collates batches in a daemon thread
that is still running when training ends. Python < 3.14 ends a daemon thread at exit with
pthread_exit; when that thread is inside a torch op, unwinding its C++ frames aborts the finished
process with "terminate called without an active exception" (SIGABRT; CPython gh-87135). Here the
thread checks a stop flag between batches, and an exit hook sets it, unblocks the queue and waits.
"""
import atexit
import logging
import queue
import threading
import time

import torch
from fairseq.data import iterators

logger = logging.getLogger(__name__)

FairseqConsumer = iterators.BackgroundConsumer
_stop = threading.Event()


class StoppableConsumer(FairseqConsumer):
    def run(self):
        if self.cuda_device is not None:
            torch.cuda.set_device(self.cuda_device)
        try:
            for item in self._source:
                self._queue.put(item)
                self.count += 1
                if _stop.is_set():
                    return
                if self._max_len is not None and self.count >= self._max_len:
                    break
            self._queue.put(iterators._sentinel)
        except Exception as e:
            self._queue.put(e)


def stop_consumers(timeout=60.0):
    """Let every prefetch thread finish the batch it is making, then return."""
    _stop.set()
    deadline = time.monotonic() + timeout
    for t in [t for t in threading.enumerate() if isinstance(t, StoppableConsumer)]:
        while t.is_alive() and time.monotonic() < deadline:
            try:  # a thread blocked on a full queue wakes up once a batch is taken out
                while True:
                    t._queue.get_nowait()
            except queue.Empty:
                pass
            t.join(0.05)
        if t.is_alive():
            logger.warning(f"a batch-prefetch thread still runs after {timeout:.0f} s; the process may abort at exit")


iterators.BackgroundConsumer = StoppableConsumer
atexit.register(stop_consumers)
