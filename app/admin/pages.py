"""The page frame of the viewer, and its login and error pages."""

from __future__ import annotations

from dataclasses import dataclass

from app.admin import urls
from app.admin.auth import ALL_TENANTS
from app.admin.markup import Markup, join, raw, tag


@dataclass(frozen=True, slots=True)
class Frame:
    """What the top bar shows: the tenant in view and whether there is a login to end."""

    tenant: str | None = None
    signed_in: bool = False


def layout(title: str, body: Markup, frame: Frame | None = None) -> Markup:
    """A whole HTML document: our stylesheet and script only (no CDN, no inline code)."""
    frame = frame or Frame()
    bar: list[Markup] = [tag("a", "Sessions", href=urls.index(), class_="brand"),
                         tag("a", "Usage", href=urls.usage(), class_="nav")]
    if frame.tenant is not None:
        shown = "all tenants" if frame.tenant == ALL_TENANTS else f"tenant {frame.tenant}"
        bar.append(tag("span", shown, class_="badge tenant"))
    if frame.signed_in:
        bar.append(tag("form", tag("button", "Sign out", type="submit", class_="link"),
                       method="post", action=f"{urls.PREFIX}/logout", class_="logout"))
    head = join([
        tag("meta", charset="utf-8"),
        tag("meta", name="viewport", content="width=device-width, initial-scale=1"),
        tag("title", f"{title} · gateway viewer"),
        tag("link", rel="icon", href="data:,"),  # no favicon request
        tag("link", rel="stylesheet", href=urls.static("admin.css")),
        tag("script", src=urls.static("admin.js"), defer=True),
    ])
    document = tag("html", tag("head", head),
                   tag("body", tag("nav", bar, class_="top"), tag("main", body)), lang="en")
    return Markup(raw("<!doctype html>\n") + document)


def login_page(next_url: str, message: str | None = None) -> Markup:
    form = tag(
        "form",
        tag("label", "Admin token", tag("input", type="password", name="token", required=True,
                                         autocomplete="current-password", autofocus=True)),
        tag("input", type="hidden", name="next", value=next_url),
        tag("button", "Sign in", type="submit"),
        method="post", action=f"{urls.PREFIX}/login", class_="login",
    )
    body = [tag("h1", "Sign in"),
            tag("p", "The session viewer needs the gateway's admin token (GATEWAY_ADMIN_TOKEN).")]
    if message:
        body.append(tag("p", message, class_="notice bad"))
    body.append(form)
    return layout("Sign in", join(body))


def error_page(status: int, message: str, frame: Frame | None = None) -> Markup:
    titles = {400: "Bad request", 401: "Sign in", 403: "Forbidden", 404: "Not found",
              405: "Method not allowed", 422: "Unreadable session", 500: "Internal error"}
    title = titles.get(status, "Error")
    body = join([tag("h1", f"{status} {title}"), tag("p", message, class_="notice bad"),
                 tag("p", tag("a", "Back to the sessions", href=urls.index()))])
    return layout(title, body, frame)
