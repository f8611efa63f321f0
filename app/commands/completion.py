"""``gateway completion bash|zsh|fish``: print the shell code that completes ``gateway``.

The completion itself is argcomplete's: the shell calls ``gateway`` back with the line being
typed and argcomplete answers from the same argparse parser, so it always matches the options.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from argcomplete import shell_integration

SHELLS = ("bash", "zsh", "fish")
DESCRIPTION = """\
Print the code that makes your shell complete gateway's commands and options. Add one line to
your shell's start-up file:  eval "$(gateway completion bash)"   (zsh: the same with zsh;
fish: gateway completion fish | source)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("shell", choices=SHELLS, help="the shell to complete in")


def run(args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    out.write(shell_integration.shellcode(["gateway"], shell=args.shell))
    return 0
