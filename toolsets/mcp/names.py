"""Tool names the model sees: ``server__tool``, within every provider's rules.

Anthropic and OpenAI both take ``^[a-zA-Z0-9_-]{1,64}$``. A name that fits is used as is; one
that does not has its other characters replaced by ``_`` and, when that changed or cut it, a
short hash of the original appended, so two different tools never share a name and the same
tool gets the same name on every machine and every run (tool sets are content-addressed).
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
SEPARATOR = "__"
_OUTSIDE = re.compile(r"[^A-Za-z0-9_-]")


def tool_name(server: str, tool: str) -> str:
    """The model-facing name of ``tool`` on ``server``."""
    raw = f"{server}{SEPARATOR}{tool}"
    clean = _OUTSIDE.sub("_", raw)
    if clean == raw and len(raw) <= MAX_NAME:
        return raw
    digest = hashlib.sha256(raw.encode()).hexdigest()[:8]
    return f"{clean[: MAX_NAME - len(digest) - 1]}_{digest}"
