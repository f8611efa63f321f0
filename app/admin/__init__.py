"""The operator's session viewer: read-only HTML pages over the session logs.

Served by the gateway under ``/admin`` when ``GATEWAY_ADMIN_TOKEN`` is set (no token: the pages
do not exist, 404), and standalone by ``gateway viewer``. Modules, data path first:

    site.py           routes, the access guard, handlers (the only module that does I/O)
    auth.py           the token, the login cookie, and the tenancy rule
    listing.py        the sessions list: filters, pagination, page
    session_pages.py  the session page, one call's page, the prompt diff page
    render.py         messages, prompt-change markers and provider calls as HTML
    diff.py           section-aware diff of two prompt versions (pure)
    chart.py          the drift chart as inline SVG (pure)
    markup.py         the escaping HTML builder every page is made with
    static/           admin.css and admin.js, shipped as package data
"""

from app.admin.auth import Access
from app.admin.site import AdminSite, SessionSource

__all__ = ["Access", "AdminSite", "SessionSource"]
