"""The gateway's version, as its installed distribution says (``gateway --version``, the
traces' ``service.version``)."""

from __future__ import annotations

from importlib import metadata


def version() -> str:
    try:
        return metadata.version("gateway")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown"
