"""The command-line grammar shared by every `python -m qknorm_pipeline.<tool>` (and scripts/*.sh):
`--help` lists every option; exit 0 ok, 2 usage error, 1 failure; an error is one line that names
the fix, never a traceback for a user's mistake. Imports no fairseq."""
import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the usage block and the error, and
    the description (a module's docstring) shown as written."""

    def __init__(self, *args, formatter_class=argparse.RawDescriptionHelpFormatter, **kwargs):
        super().__init__(*args, formatter_class=formatter_class, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

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


def fail(error, status=1):
    """A tool's own error (its message names the problem and the fix) as one line; returns STATUS."""
    print(f"error: {error}", file=sys.stderr)
    return status


def run(main, argv=None):
    """Runs main(argv) as a command: Ctrl-C and a closed output pipe end it with one line."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
