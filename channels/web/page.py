"""The chat page's files: which ones the channel serves, with what type and headers, read once.

Apart from :mod:`channels.web.channel` because it is the page, not the API: a table of package
data under ``static/`` (no CDN), the headers that lock the page down, and the one edit the
page gets (the operator's replay command on its hint).
"""

from __future__ import annotations

import html
from importlib import resources

ASSETS = {
    "index.html": "text/html",
    "app.js": "text/javascript",
    "style.css": "text/css",
    "attachments.js": "text/javascript",
    "attachments.css": "text/css",
    # Markdown of the answers: vendored from npm (licenses beside them), never a CDN.
    "markdown.js": "text/javascript",
    "markdown.css": "text/css",
    "markdown-it.min.js": "text/javascript",
    "purify.min.js": "text/javascript",
    "favicon.svg": "image/svg+xml",
}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self' data: blob:; base-uri 'none'; form-action 'none'; "
        "frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def with_replay(page: bytes, command: str) -> bytes:
    """The page with ``command`` (``... replay {session}``) on its replay hint's element,
    where the script reads it (``data-command``)."""
    marker = b'<code id="replay-command">'
    assert marker in page, "index.html lost its replay hint"
    attribute = html.escape(command, quote=True).encode()
    return page.replace(marker, b'<code id="replay-command" data-command="' + attribute + b'">')


def load_assets() -> dict[str, bytes]:
    folder = resources.files("channels.web") / "static"
    return {name: (folder / name).read_bytes() for name in ASSETS}
