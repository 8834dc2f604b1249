"""The command-line grammar of every step (`python -m qknorm_pipeline.<step>`, or its door
`bash scripts/<step>.sh`): `--help` lists every option; exit 0 ok, 2 a usage error, 1 a failure;
an error is one line `[step] error: ...` that names the fix, never a traceback for a user's mistake.
Library code raises a UserError; `main` turns it into that line."""
import argparse
import dataclasses
import os
import re
import signal
import sys
import threading
import time

from .paths import folders


class UserError(Exception):
    """A problem the user can fix, with a message that names it and the fix. Exit status 1."""

    exit_code = 1


class UsageError(UserError):
    """A mistake on the command line or in a config (exit 2; the line points to --help)."""

    exit_code = 2


def prog(module):
    """What a user typed: the door `bash scripts/NAME` when one started us, else `python -m MODULE`."""
    door = os.environ.get("QKNORM_DOOR")
    return f"bash {door}" if door else f"python -m {module}"


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the usage block, and the description
    (a module's docstring) shown as written. TAG names the step in error lines."""

    def __init__(self, *args, tag=None, unknown_hint="", formatter_class=argparse.RawDescriptionHelpFormatter,
                 **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)
        self.tag = tag or self.prog.split()[-1].rsplit(".", 1)[-1].removesuffix(".sh")
        self.unknown_hint = unknown_hint

    def parse_known_args(self, args=None, namespace=None):
        self.argv = list(sys.argv[1:] if args is None else args)
        parsed, rest = super().parse_known_args(args, namespace)
        # `--name "$RUN"` with RUN unset: an empty value would silently mean the default
        for action in self._actions:
            if action.option_strings and getattr(parsed, action.dest, None) == "" and action.default != "":
                self.error(f"{action.option_strings[-1]} needs a value, got an empty string")
        return parsed, rest

    def error(self, message):
        # argparse's wording, in the words of the rest of the project
        if message.startswith("the following arguments are required"):
            # an unknown option is the cause when it took the place of a positional (`ablate.sh --bogus`)
            words = getattr(self, "argv", [])
            words = words[:words.index("--")] if "--" in words else words
            unknown = [w for w in words if w.startswith("-") and w.split("=")[0] not in self._option_string_actions]
            if unknown:
                message = f"unrecognized arguments: {unknown[0]}"
        m = re.match(r"argument (--[\w-]+)(/[^:]*)?: expected one argument", message)
        if m:
            message = f"{m.group(1)} needs a value"
        m = re.match(r"unrecognized arguments: (\S+)", message)
        if m:
            message = f"unknown option {m.group(1)}{self.unknown_hint}"
        self.exit(2, f"[{self.tag}] error: {message} (see {self.prog} --help)\n")

    def named(self, items, flag, form="NAME=PATH", default_name=None):
        """[(NAME, VALUE)] of the NAME=VALUE arguments given to FLAG, each NAME once; a bare VALUE is
        named default_name(VALUE) when that is given, else a usage error."""
        out = {}
        for item in items or []:
            name, sep, value = item.partition("=")
            if not sep and default_name:
                name, value = default_name(item), item
            if not name or not value:
                self.error(f"{flag} expects {form}, got {item!r}")
            if name in out:
                self.error(f"{flag}: the name {name!r} is given twice (name each one: {flag} {form})")
            out[name] = value
        return list(out.items())


def one_pair(args, default=None):
    """The pair of a step's command line: PAIR (args.pair_arg) or --pair PAIR (args.pair), once."""
    if args.pair and args.pair_arg and args.pair != args.pair_arg:
        raise UsageError(f"one pair at a time (got {args.pair_arg!r} and {args.pair!r})")
    pair = args.pair or args.pair_arg or default
    if not pair:
        raise UsageError("name a pair: PAIR or --pair PAIR")
    return pair


def log(tag, text):
    """One progress line on stderr: [TAG HH:MM:SS] TEXT."""
    print(f"[{tag} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _takes_extra(parser):
    """PARSER (or one of its sub-commands) has the positional `extra`: flags for fairseq after --."""
    for action in parser._actions:
        if action.dest == "extra":
            return True
        if isinstance(action, argparse._SubParsersAction) and any(map(_takes_extra, action.choices.values())):
            return True
    return False


def report(tag, error, prog=None):
    """Print ERROR (a UserError) as its one line; a usage error points to PROG's --help. Returns
    its exit status."""
    hint = f" (see {prog} --help)" if prog and isinstance(error, UsageError) else ""
    print(f"[{tag}] error: {error}{hint}", file=sys.stderr)
    return error.exit_code


def _output_hint(path):
    """Where PATH lies in one of the output folders, which ones they are and how they are moved."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return ""
    full = os.path.abspath(os.fsdecode(path))
    if not any(full == f or full.startswith(f + os.sep) for f in dataclasses.astuple(folders())):
        return ""  # a path the command was given
    return " (the output folders are DATA_DIR, DATA_BIN, CKPT_DIR, LOG_DIR and RESULTS_DIR: docs/usage.md)"


class Terminated(BaseException):
    """SIGTERM (kill, a batch system's time limit), raised as Ctrl-C's KeyboardInterrupt is, so that
    every clean-up runs (a file half written is removed) instead of the process just ending."""


def _terminated(signum, frame):
    raise Terminated


def main(run, parser, argv=None):
    """Parse ARGV with PARSER and call run(args); the exit status: 0, or a UserError's (its message
    one line), 130 on Ctrl-C, 143 on SIGTERM, 1 on a closed output pipe. Everything after `--` goes to args.extra
    unparsed: argparse cannot give a positional `extra` the words after `--` once an option stood
    between it and the other positionals (`reproduce.sh PAIR --systems "a b" -- --max-update 40`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = None
    if "--" in argv and _takes_extra(parser):
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    args = parser.parse_args(argv)
    if extra is not None:
        args.extra = list(getattr(args, "extra", None) or []) + extra
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a handler
    before = signal.signal(signal.SIGTERM, _terminated) if main_thread else None
    try:
        run(args)
        return 0
    except UserError as e:
        return report(parser.tag, e, parser.prog)
    except KeyboardInterrupt:
        print(f"[{parser.tag}] interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print(f"[{parser.tag}] terminated (SIGTERM); the same command goes on from there", file=sys.stderr)
        return 143
    except BrokenPipeError:
        return 1
    except OSError as e:
        if e.filename is None:
            raise
        # a file or folder that cannot be read, made or written (a path that is a file, no permission, a full disk)
        print(f"[{parser.tag}] error: {e.filename}: {e.strerror}; check that path{_output_hint(e.filename)}",
              file=sys.stderr)
        return 1
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, before)
