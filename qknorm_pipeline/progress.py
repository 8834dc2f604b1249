"""Live progress of a training or decoding run, read from the output fairseq already writes.

qknorm_pipeline/processes.py runs the child and hands its output to follow_training or
follow_decoding. Every line is appended to the log unchanged, so the whole fairseq log stays on
disk. Training progress comes from fairseq's JSON records (`--log-format json`: `train_inner`
every --log-interval updates, `valid` at each validation); decoding progress counts
fairseq-generate's `S-` lines (one per sentence). On a terminal a tqdm bar is redrawn on stderr;
otherwise (CI, nohup, `| tee`) plain lines are printed: for training one per validation and at
least every EVERY seconds, for decoding every EVERY seconds. QKNORM_PROGRESS=bar or =lines forces
either; VERBOSE=1 echoes every line instead. Warnings and errors of the run (`| WARNING |`,
`| ERROR |`, Python warnings) are always shown, except that python_warnings="count" (for a program
we do not control, like plain fairseq-train) shows one line counting its Python warnings instead,
at its first record, or at the end if it stops before one. One summary line at the end; a training's
says where its time went: start-up (to fairseq's first epoch), validations (from fairseq's "begin
validation" line to its record) and checkpoint writing (fairseq's own "writing took" seconds).
"""
import os
import re
import sys
import time
from types import SimpleNamespace

from .fairseq_log import parse_line
from .paths import shareable

EVERY = 300.0  # seconds between plain progress lines at most, without a terminal
RESUMED = re.compile(r"Loaded checkpoint .*\(epoch \d+ @ (\d+) updates\)")
STARTED = re.compile(r"\| begin training epoch \d+$")
VALIDATING = re.compile(r'\| begin validation on "')
SAVED = re.compile(r"\| Saved checkpoint .*\(writing took ([\d.]+) seconds\)")
PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")
SHOWN = re.compile(r"\| (WARNING|ERROR|CRITICAL) \||^Traceback|^\w*Error: |" + PY_WARNING.pattern)


def clock(seconds):
    seconds = int(round(seconds))
    h, rem = divmod(seconds, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def stamp(tag, text):
    return f"[{tag} {time.strftime('%H:%M:%S')}] {text}"


class Training:
    """What the display shows, updated from fairseq's records."""

    def __init__(self, max_update):
        self.max_update = max_update
        self.t0 = time.monotonic()
        self.first = None  # (update, time) of the first record: the rate covers validations too
        self.update = 0
        self.loss = self.lr = self.ups = self.bleu = self.best = None
        self.best_update = None
        self.validated_at = []  # updates of the validations seen (their spacing: the validation interval)
        self.start_up = self.validating_since = None
        self.validation_s = self.checkpoint_s = 0.0
        self.validations_timed = 0  # those whose "begin validation" line was seen

    def feed(self, line):
        """The kind of fairseq record the line held ("train_inner", "valid", "train"), else None."""
        now = time.monotonic()
        m = RESUMED.search(line)
        if m:
            self.update = int(m.group(1))
            return None
        if self.start_up is None and STARTED.search(line):
            self.start_up = now - self.t0
        if VALIDATING.search(line):
            self.validating_since = now
        m = SAVED.search(line)
        if m:
            self.checkpoint_s += float(m.group(1))
        parsed = parse_line(line)
        if parsed is None:
            return None
        kind, rec = parsed
        if kind == "train_inner":
            self.update = int(rec["num_updates"])
            self.loss, self.lr, self.ups = rec.get("loss"), rec.get("lr"), rec.get("ups")
            if self.first is None:
                self.first = (self.update, now)
        elif kind == "valid":
            if self.validating_since is not None:
                self.validation_s += now - self.validating_since
                self.validations_timed += 1
                self.validating_since = None
            self.update = int(rec.get("valid_num_updates", self.update))
            self.validated_at.append(self.update)
            self.bleu = rec.get("valid_bleu")
            self.best = rec.get("valid_best_bleu", self.bleu)
            if self.bleu is not None and self.bleu == self.best:
                self.best_update = self.update
        return kind

    def validation_due(self):
        """True when a validation record is expected right after this update (its line will follow)."""
        v = self.validated_at
        every = v[-1] - v[-2] if len(v) >= 2 else (v[0] if v else None)
        return bool(every) and self.update % every == 0

    def rate(self):
        """Updates per second over the whole run so far (validation included), else fairseq's ups."""
        if self.first and self.update > self.first[0]:
            return (self.update - self.first[0]) / max(time.monotonic() - self.first[1], 1e-9)
        return self.ups

    def fields(self):
        out = []
        if self.loss is not None:
            out.append(f"loss {self.loss:.3f}")
        if self.bleu is not None:
            out.append(f"dev BLEU {self.bleu:.2f}")
        if self.lr is not None:
            out.append(f"lr {self.lr:.2e}")
        rate = self.rate()
        if rate:
            out.append(f"{rate:.2f} upd/s")
            if self.max_update:
                out.append(f"ETA {clock(max(self.max_update - self.update, 0) / rate)}")
        return out

    def line(self, label):
        total = f"/{self.max_update}" if self.max_update else ""
        return "  ".join([f"{label} {self.update}{total} updates", *self.fields()])

    def summary(self, label):
        text = f"{label}: {self.update} updates in {clock(time.monotonic() - self.t0)}"
        if self.loss is not None:
            text += f", loss {self.loss:.3f}"
        if self.best is not None:
            text += f", best dev BLEU {self.best:.2f}" + (f" (update {self.best_update})" if self.best_update else "")
        spent = []
        if self.start_up is not None:
            spent.append(f"start-up {clock(self.start_up)}")
        if self.validations_timed:
            n = self.validations_timed
            spent.append(f"{n} validation{'s' * (n > 1)} {clock(self.validation_s)}")
        if self.checkpoint_s:
            spent.append(f"checkpoint writing {clock(self.checkpoint_s)}")
        return text + (f"; of that, {', '.join(spent)}" if spent else "")


def _bar(total, label, unit, right):
    from tqdm import tqdm

    label = label.replace("{", "{{").replace("}", "}}")
    return tqdm(total=total or None, file=sys.stderr, dynamic_ncols=True, leave=False,
                bar_format=f"{label} {{n_fmt}}/{{total_fmt}} {unit} |{{bar}}| {right}")


def follow(args, stream, on_line):
    """Copy STREAM (binary lines) to args.log line by line, calling on_line(text, shown) for each,
    shown telling whether the line must be displayed (a run warning); counts Python warnings under
    --python-warnings count."""
    counted, said = [0], [False]

    def say_count():
        if counted[0] and not said[0]:
            print(stamp(args.tag, f"{counted[0]} Python warning{'s' * (counted[0] > 1)} from the run's libraries, "
                                  f"not shown; full text in {shareable(args.log)}"), file=sys.stderr, flush=True)
        said[0] = True

    with open(args.log, "ab", buffering=0) as log:
        for raw in stream:
            log.write(raw)
            text = raw.decode("utf-8", "replace").rstrip("\n")
            if args.verbose:
                print(text, file=sys.stderr, flush=True)
            shown = bool(SHOWN.search(text)) and not args.verbose
            if shown and args.python_warnings == "count" and PY_WARNING.search(text):
                counted[0] += 1
                shown = False
            elif not said[0] and parse_line(text):
                say_count()
            on_line(text, shown)
    say_count()


def follow_with_bar(args, stream, bar, on_line):
    """follow(), closing the bar (if any) however the input ends."""
    try:
        follow(args, stream, on_line)
    finally:
        if bar is not None:
            bar.close()


def mode(args):
    if args.verbose:
        return "verbose"
    forced = os.environ.get("QKNORM_PROGRESS", "")
    if forced in ("bar", "lines"):
        return forced
    return "bar" if sys.stderr.isatty() else "lines"


def follow_training(stream, log, label, max_update=0, tag="train", python_warnings="show", every=EVERY):
    """Append STREAM, a training's output (binary lines: fairseq's JSON log records), to LOG and
    show its progress."""
    args = _settings(log, label, tag, every, max_update=max_update, python_warnings=python_warnings)
    state, how = Training(args.max_update), mode(args)
    bar = _bar(args.max_update, args.label, "updates", "{desc}") if how == "bar" else None
    last = [time.monotonic()]

    def on_line(text, shown):
        if shown:
            (bar.write if bar else print)(stamp(args.tag, text), file=sys.stderr)
        kind = state.feed(text)
        if bar is not None:
            bar.n = state.update
            bar.set_description_str("  ".join(state.fields()), refresh=True)
        elif how == "lines" and state.first and (kind == "valid" or (
                kind == "train_inner" and time.monotonic() - last[0] >= args.every and not state.validation_due())):
            print(stamp(args.tag, state.line(args.label)), file=sys.stderr, flush=True)
            last[0] = time.monotonic()

    follow_with_bar(args, stream, bar, on_line)
    if state.update:  # nothing to sum up when fairseq stopped before its first update (see its log)
        print(stamp(args.tag, state.summary(args.label)), file=sys.stderr, flush=True)


def follow_decoding(stream, log, label, total, tag="evaluate", every=EVERY):
    """Append STREAM, fairseq-generate's standard output (binary lines), to LOG and show the
    progress over its TOTAL sentences."""
    args = _settings(log, label, tag, every, total=total, python_warnings="show")
    how, t0 = mode(args), time.monotonic()
    bar = _bar(args.total, args.label, "sentences", "{rate_fmt}  ETA {remaining}") if how == "bar" else None
    done, last = [0], [t0]

    def on_line(text, shown):
        if shown:
            (bar.write if bar else print)(stamp(args.tag, text), file=sys.stderr)
        if not text.startswith("S-"):
            return
        done[0] += 1
        if bar is not None:
            bar.update(1)
        elif how == "lines" and time.monotonic() - last[0] >= args.every:
            print(stamp(args.tag, f"{args.label} {done[0]}/{args.total} sentences decoded"), file=sys.stderr, flush=True)
            last[0] = time.monotonic()

    follow_with_bar(args, stream, bar, on_line)
    took = time.monotonic() - t0
    print(stamp(args.tag, f"{args.label}: decoded {done[0]}/{args.total} sentences in {clock(took)} "
                          f"({done[0] / max(took, 1e-9):.1f} sentences/s)"), file=sys.stderr, flush=True)


def _settings(log, label, tag, every, **fields):
    return SimpleNamespace(log=log, label=label, tag=tag, every=every, verbose=verbose_env(), **fields)


def verbose_env():
    return os.environ.get("VERBOSE", "0") not in ("", "0")
