"""How the web chat's conversations are named in the logs, for tests that read them back.

The gateway keys a web conversation under its person (``<person>.<id>``: see
:func:`channels.web.convert.own_conversation`) in the web tenant (``web``), so a session's
conversation label is ``web:<person>.<id>``; tests that plan conversations by the id the
client sent look them up by :func:`client_label`.
"""

from __future__ import annotations

from gateway.edge.ids import WEB_TENANT

__all__ = ["WEB_TENANT", "client_label"]


def client_label(label: str | None) -> str:
    """``web:<person>.<id>`` as ``web:<id>`` (any other label as it is)."""
    if label is None or not label.startswith("web:"):
        return label or ""
    person, dot, own = label.removeprefix("web:").partition(".")
    return f"web:{own}" if dot and person[:2] in ("a-", "c-", "t-") else label
