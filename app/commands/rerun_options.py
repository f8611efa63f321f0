"""The options of ``gateway replay ID --rerun N`` and their usage errors, apart from the rerun
itself (:mod:`app.commands.rerun`, which imports the providers): ``gateway replay --help`` and
a shell completing it need only these."""

from __future__ import annotations

import argparse

from app.commands.common import CommandError

PROVIDERS = ("anthropic", "openai", "offline")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The rerun options of ``gateway replay``."""
    group = parser.add_argument_group("counterfactual rerun")
    group.add_argument("--rerun", type=int, metavar="N",
                       help="send call N's recorded request again and print both answers "
                            "(tool calls get their recorded results; see --live-tools)")
    group.add_argument("--provider", choices=PROVIDERS, default=None,
                       help="provider for --rerun (default: the recorded one when it is "
                            "configured, else offline)")
    group.add_argument("--model", default=None, help="model for --rerun (default: the recorded)")
    group.add_argument("--drop-section", action="append", default=[], metavar="S",
                       help="leave section S out of the system prompt (repeatable)")
    group.add_argument("--replace-section", action="append", default=[], metavar="S=FILE",
                       help="use FILE's text for section S (repeatable)")
    group.add_argument("--save", action="store_true",
                       help="write the rerun to <data-dir>/reruns/<tenant>/<id>.jsonl")
    group.add_argument("--live-tools", action="store_true",
                       help="run the answer's MCP tool calls against the configured servers "
                            "and show where results differ (default: the recorded results)")


def check_options(args: argparse.Namespace) -> None:
    """Usage errors: rerun-only options without ``--rerun`` (never silently ignored), and
    ``--rerun`` with another mode of ``gateway replay``."""
    if args.rerun is None:
        stray = [flag for flag, given in (
            ("--provider", args.provider is not None), ("--model", args.model is not None),
            ("--drop-section", bool(args.drop_section)),
            ("--replace-section", bool(args.replace_section)), ("--save", args.save),
            ("--live-tools", args.live_tools),
        ) if given]
        if stray:
            raise CommandError(f"{', '.join(stray)} only apply with --rerun N")
        return
    conflicts = [flag for flag, given in (
        ("--list", args.list), ("--call", args.call is not None),
        ("--request", args.request is not None), ("--shape", args.shape is not None),
    ) if given]
    if conflicts:
        raise CommandError(f"--rerun cannot be combined with {', '.join(conflicts)}")
