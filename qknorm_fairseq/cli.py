"""The command-line grammar shared by every `python -m qknorm_fairseq.<tool>` (and scripts/*.sh):
`--help` lists every option; exit 0 ok, 2 usage error, 1 failure; an error is one line that names
the fix, never a traceback for a user's mistake. Imports no fairseq."""
import argparse
import sys


class Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2) instead of the usage block and the error."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def run(main, argv=None):
    """Runs main(argv) as a command: Ctrl-C and a closed output pipe end it with one line."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1
