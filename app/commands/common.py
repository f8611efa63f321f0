"""Helpers shared by CLI subcommands: one-line errors and exit codes."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

EXIT_OK = 0
EXIT_UNREADABLE = 1
EXIT_USAGE = 2


class CommandError(Exception):
    """Ends a command with one line on stderr and an exit code; never a traceback."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line: ``<prog>: <message>`` and exit 2."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: {message}\n")
        raise SystemExit(EXIT_USAGE)
