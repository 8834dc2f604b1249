"""Download one URL to a verified file: retries with back-off on network errors, resume over HTTP
Range, a progress bar, and the published size / sha256 / md5 checked before the file is kept.

The file is written to DEST.part and renamed to DEST only once complete and verified, so DEST
always means "verified". An interrupted transfer keeps DEST.part and the next attempt (or the
next run) asks the server for the rest; a server that ignores Range sends it all again.
A file that fails a check is deleted, .part included: nothing unverified is kept.
"""
import http.client
import os
import sys
import time
import urllib.error
import urllib.request

from ..files import file_digest, locked
from .common import DataError, NotFound, log

RETRIES = 5  # further attempts after a network error
BACKOFF_S = 2.0  # waits of 2, 4, 8, ... seconds between them
REPORT_S = 30.0  # seconds between progress lines when stderr is not a terminal
BLOCK = 1 << 20
TRANSIENT_HTTP = {408, 425, 429, 500, 502, 503, 504}


class _Transient(Exception):
    """A network failure worth another attempt."""


def looks_like_html(head):
    h = head[:1024].lstrip().lower()
    return h.startswith(b"<!doctype html") or h.startswith(b"<html") or b"<html" in h[:200]


def _mib(n):
    return f"{n / (1 << 20):.1f} MiB"


class Progress:
    """tqdm's bar (size, rate, ETA) on a terminal; otherwise a plain line every REPORT_S seconds."""

    def __init__(self, name, total, done):
        self.name, self.total, self.done, self.start_done = name, total, done, done
        self.t0 = self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=done, unit="B", unit_scale=True, unit_divisor=1024,
                            desc=name, file=sys.stderr, dynamic_ncols=True)

    def update(self, n):
        self.done += n
        if self.bar is not None:
            self.bar.update(n)
            return
        now = time.monotonic()
        if now - self.last >= REPORT_S:
            self.last = now
            log(self.line(now))

    def line(self, now):
        rate = (self.done - self.start_done) / max(now - self.t0, 1e-6)
        if not self.total:
            return f"{self.name}: {_mib(self.done)} at {_mib(rate)}/s"
        eta = (self.total - self.done) / rate if rate > 0 else float("inf")
        eta_s = "?" if eta == float("inf") else f"{int(eta) // 60}:{int(eta) % 60:02d}"
        return (f"{self.name}: {_mib(self.done)} of {_mib(self.total)} ({100 * self.done / self.total:.0f}%) "
                f"at {_mib(rate)}/s, ETA {eta_s}")

    def close(self):
        if self.bar is not None:
            self.bar.close()
        else:
            log(self.line(time.monotonic()))


def _open(url, offset):
    """The response for URL from byte OFFSET on; None when the server has nothing past OFFSET."""
    req = urllib.request.Request(url, headers={"Range": f"bytes={offset}-"} if offset else {})
    try:
        return urllib.request.urlopen(req, timeout=60)
    except urllib.error.HTTPError as e:
        if e.code == 404:
            raise NotFound(f"{url}: not found (HTTP 404)") from None
        if e.code == 416 and offset:
            return None
        if e.code in TRANSIENT_HTTP:
            raise _Transient(f"HTTP {e.code} {e.reason}") from None
        raise DataError(f"{url}: HTTP {e.code} {e.reason}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, FileNotFoundError) or "No such file" in str(e.reason):
            raise NotFound(f"{url}: not found") from None
        raise _Transient(f"cannot connect ({e.reason})") from None
    except (OSError, http.client.HTTPException) as e:
        raise _Transient(f"connection failed ({e})") from None


def _transfer(url, part, name):
    offset = os.path.getsize(part) if os.path.exists(part) else 0
    resp = _open(url, offset)
    if resp is None:  # the .part already holds the whole file: verification decides
        return
    with resp:
        if offset and getattr(resp, "status", None) != 206:
            log(f"{name}: the server does not resume (no HTTP Range support): starting again")
            offset = 0
        if "text/html" in (resp.headers.get("Content-Type") or "").lower():
            raise DataError(f"{url}: received an HTML page instead of data (the URL is dead or moved); "
                            "another source is needed")
        length = resp.headers.get("Content-Length")
        total = offset + int(length) if length is not None else None
        progress = Progress(name, total, offset)
        got = offset
        with open(part, "ab" if offset else "wb") as f:
            try:
                for block in iter(lambda: resp.read(BLOCK), b""):
                    f.write(block)
                    got += len(block)
                    progress.update(len(block))
            except (OSError, http.client.HTTPException) as e:
                raise _Transient(f"interrupted after {got} bytes ({e.__class__.__name__})") from None
            finally:
                progress.close()
    if total is not None and got < total:
        raise _Transient(f"interrupted after {got} of {total} bytes")


def _fail(part, msg):
    if os.path.exists(part):
        os.remove(part)
    raise DataError(msg)


def verify(path, url, expect=None, min_size=1):
    """Raises DataError naming the file, the expected and the actual value (and deletes PATH)
    when PATH is an HTML page, too small, or differs from the published size or checksums."""
    name = url.rstrip("/").rsplit("/", 1)[-1]
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(1024)
    if looks_like_html(head):
        _fail(path, f"{url}: received an HTML page instead of data (the URL is dead or moved); "
                    "another source is needed")
    if size < min_size:
        _fail(path, f"{url}: received {size} bytes, expected at least {min_size}")
    if expect is None:
        return
    checks = [("size", expect.size, lambda: size)]
    checks += [(algo, getattr(expect, algo), lambda a=algo: file_digest(path, a)) for algo in ("sha256", "md5")]
    for what, wanted, actual in checks:
        if wanted is None:
            continue
        got = actual()
        if got != wanted:
            _fail(path, f"{name}: {what} mismatch: expected {wanted}, got {got} (from {url}); nothing was kept: "
                        "the file is corrupt or changed upstream, run again or use another --source")


def fetch(url, dest, expect=None, min_size=1):
    """URL -> DEST, verified against EXPECT (a sources.Published or None). An existing DEST is
    reused: it is only ever created complete and verified."""
    folder = os.path.dirname(os.path.abspath(dest))
    os.makedirs(folder, exist_ok=True)
    # two runs never write the same .part at once
    with locked(folder, lambda: log(f"waiting for another download into {folder} to finish")):
        if os.path.exists(dest):
            log(f"reusing {dest}")
            return dest
        _fetch(url, dest, expect, min_size)
    return dest


def _fetch(url, dest, expect, min_size):
    part, name = dest + ".part", url.rstrip("/").rsplit("/", 1)[-1]
    for attempt in range(RETRIES + 1):
        kept = os.path.getsize(part) if os.path.exists(part) else 0
        log(f"resuming {url} at byte {kept}" if kept else f"fetching {url}")
        try:
            _transfer(url, part, name)
            break
        except _Transient as e:
            if attempt == RETRIES:
                kept = os.path.getsize(part) if os.path.exists(part) else 0
                again = (f"run the command again to resume from {part} ({kept} bytes kept)" if kept else
                         "check the network (or the URL) and run the command again")
                raise DataError(f"{url}: {e}; gave up after {RETRIES + 1} attempts; {again}") from None
            wait = BACKOFF_S * 2 ** attempt
            log(f"{url}: {e}; retry {attempt + 1} of {RETRIES} in {wait:g} s")
            time.sleep(wait)
        except DataError:
            if os.path.exists(part):
                os.remove(part)
            raise
    verify(part, url, expect, min_size)
    os.replace(part, dest)
