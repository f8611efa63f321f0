"""What a test needs from the machine, and what becomes of it when that is missing.

Some tests need more than Python: PostgreSQL and Redis (the shared servers, or their binaries
for a private one), ``mount`` as root (the tmpfs disk-fault trials), Chromium, systemd-analyze,
an IPv4 address other than loopback. On a developer's machine a missing one skips the test and
says what to install. In CI (``CI=true``, as CI runs ``.ci/run``, or
``GATEWAY_REQUIRE_SERVICES=1``) it fails the test instead: ``.ci/run`` installs every one of
them, so a skip there would be a test that never ran, reported as if all were well.

A test whose *subject* is missing (a module of ours, a route) never skips at all: that is a
failure anywhere.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def required() -> bool:
    """True where every capability must be there (CI): a missing one fails the test."""
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("GATEWAY_REQUIRE_SERVICES") == "1")


def missing(what: str) -> NoReturn:
    """Skip the running test because ``what`` is not on this machine, or fail it in CI."""
    if required():
        pytest.fail(f"{what} (required here: CI=true or GATEWAY_REQUIRE_SERVICES=1)",
                    pytrace=False)
    pytest.skip(what)


def needs(what: str, present: bool) -> pytest.MarkDecorator:
    """A mark for a capability known at import: the test runs when ``present``, else
    :func:`missing` decides (skip here, fail in CI). Applied by ``tests/conftest.py``."""
    return pytest.mark.needs(what=what, present=present)
