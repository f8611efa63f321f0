"""A tiny HTML builder whose default is escaping.

Everything the viewer shows from a session log is untrusted text (user messages, model output,
tool input, prompt sections written by the model itself). So no page is built by string
formatting: :func:`tag` escapes every child and attribute value unless it is already
:class:`Markup`, and the only way to get :class:`Markup` is from :func:`tag`, :func:`esc`,
:func:`join` or a literal in this package's code (:func:`raw`).
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import TypeAlias

Child: TypeAlias = "Markup | str | int | float | Iterable[Child] | None"
Attr: TypeAlias = str | int | float | bool | None

_VOID = frozenset({"br", "hr", "img", "input", "link", "meta", "source", "wbr"})


class Markup(str):
    """A string that is already safe HTML; never build one from untrusted text."""

    __slots__ = ()


def esc(value: object) -> Markup:
    """``value`` as HTML text: escaped (quotes too) unless it is already :class:`Markup`."""
    if isinstance(value, Markup):
        return value
    return Markup(html.escape(str(value), quote=True))


def raw(literal: str) -> Markup:
    """Mark a literal from this package's own code as HTML (never session content)."""
    return Markup(literal)


def join(children: Iterable[Child], sep: str = "") -> Markup:
    """Children escaped and concatenated (``sep`` is escaped too)."""
    return Markup(esc(sep).join(_flatten(children)))


def _flatten(children: Iterable[Child]) -> Iterable[Markup]:
    for child in children:
        if child is None:
            continue
        if isinstance(child, str | int | float):
            yield esc(child)
        else:
            yield from _flatten(child)


def _attr_name(name: str) -> str:
    # class_ -> class, data_src -> data-src (names come from this package, not from data)
    return name.rstrip("_").replace("_", "-")


def tag(element: str, /, *children: Child, **attrs: Attr) -> Markup:
    """``<element attrs>children</element>``; ``None``/``False`` attributes are left out."""
    parts = [element]
    for key, value in attrs.items():
        if value is None or value is False:
            continue
        if value is True:
            parts.append(_attr_name(key))
        else:
            parts.append(f'{_attr_name(key)}="{esc(value)}"')
    opening = f"<{' '.join(parts)}>"
    if element in _VOID:
        return Markup(opening)
    return Markup(f"{opening}{join(children)}</{element}>")
