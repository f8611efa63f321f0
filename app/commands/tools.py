"""``gateway tools list``: the MCP servers of ``GATEWAY_MCP_CONFIG`` and what they offer."""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TextIO

import orjson

from app.commands.common import EXIT_UNREADABLE, EXIT_USAGE, CommandError

if TYPE_CHECKING:
    from app.config import Settings

DESCRIPTION = """\
Reads the same settings as `gateway run` (GATEWAY_MCP_CONFIG from the environment or .env),
starts every MCP server once and prints each with its status, its tools by their MCP names
(with the name the model sees, or why a tool is not offered) and which tenants see it, then
stops them. Exit 0 when every server came up, 1 when one did not, 2 for a configuration
error."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["list"], help="list: servers, status and tools")
    parser.add_argument("--tenant", default=None,
                        help="show only the servers this tenant sees")
    parser.add_argument("--json", action="store_true", help="machine-readable output")


async def run(args: argparse.Namespace, settings: Settings, out: TextIO) -> int:
    from app.compose_tools import tool_servers_report
    from gateway.edge.errors import ConfigError

    try:
        report = await tool_servers_report(settings)
    except ConfigError as exc:
        raise CommandError(str(exc), EXIT_USAGE) from exc
    if report is None:
        out.write("no MCP servers: GATEWAY_MCP_CONFIG is not set\n")
        return 0
    if args.tenant is not None:
        report = [s for s in report if s["tenants"] is None or args.tenant in s["tenants"]]
    if args.json:
        out.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        _print(report, out)
    return 0 if all(s["status"] == "connected" for s in report) else EXIT_UNREADABLE


def _print(report: Sequence[Mapping[str, Any]], out: TextIO) -> None:
    w = out.write
    if not report:
        w("no MCP servers for this tenant\n")
    for server in report:
        status = server["status"]
        if server["error"]:
            status += f" ({server['error']})"
        protocol = f", protocol {server['protocol']}" if server["protocol"] else ""
        w(f"{server['name']}  {status}  {server['transport']}: {server['where']}{protocol}\n")
        tenants = server["tenants"]
        w(f"  tenants: {', '.join(tenants) if tenants is not None else 'all'}\n")
        if not server["tools"]:
            w("  (no tools listed)\n")
        width = max((len(t["name"]) for t in server["tools"]), default=0)
        for tool in server["tools"]:
            shown = f"-> {tool['as']}" if tool["offered"] else "(not offered: allowTools/denyTools)"
            w(f"  {tool['name']:<{width}}  {shown}\n")
