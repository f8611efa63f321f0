"""Subcommands of the ``gateway`` CLI. Each module exposes ``add_parser`` and ``run``."""
