"""The composition root, access half: who may talk to the gateway and who may administer it.

Per-channel allowlists and DM pairing (with where pairing codes and approvals live, shared
with ``gateway pairing``), the admin viewer's routes and its sign-outs. Kept apart from
:mod:`app.compose` because the CLI reaches the pairing state without building a gateway.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from app.config import Settings
from app.hints import cli_command
from app.prices import load_prices
from coordination.file_pairing import FilePairingState
from gateway.access.gate import AccessPolicy, ChannelRules
from gateway.access.pairing_live import LivePairing
from gateway.edge.coordination import Coordinator
from gateway.edge.hosts import TrustedProxies
from gateway.edge.pairing import PairingState
from gateway.edge.signouts import SignOuts
from sessions.blobs import BlobStore
from sessions.store import SessionStore


def pairing_state(data_dir: Path, redis_url: str | None,
                  redis_prefix: str | None = None) -> PairingState:
    """Where pairing codes and approvals live for the CLI: the workers' Redis when they share
    one (so an approval reaches every worker), else the gateway's private file."""
    if redis_url is None:
        return FilePairingState.under(data_dir)
    from coordination.keys import Keys
    from coordination.redis_pairing import RedisPairingState

    return RedisPairingState(redis_url, Keys(redis_prefix or Keys().prefix).pairing)


def build_access(settings: Settings, coordinator: Coordinator | None = None) -> AccessPolicy:
    """Allowlists per channel and DM pairing (see :mod:`gateway.access.gate`)."""
    rules = {
        "telegram": ChannelRules(
            users=Settings.id_list(settings.telegram_allowed_users),
            chats=Settings.id_list(settings.telegram_allowed_chats),
            pairing=settings.pairing,
        ),
        "slack": ChannelRules(
            users=Settings.id_list(settings.slack_allowed_users),
            chats=Settings.id_list(settings.slack_allowed_channels),
            pairing=settings.pairing,
        ),
    }
    state = coordinator.pairing_state() if coordinator is not None else None
    pairing = LivePairing(state or FilePairingState.under(settings.data_dir))
    return AccessPolicy(rules=rules, pairing=pairing,
                        approve_command=f"{cli_command()} pairing approve")


def build_signouts(settings: Settings) -> SignOuts:
    """Admin sign-outs: in the workers' Redis when they share one (a sign-out on one worker
    ends the sign-in on all), else in this process."""
    from app.admin.auth import Revoked

    if settings.redis_url is None:
        return Revoked()
    from coordination.redis_signouts import RedisSignOuts

    return RedisSignOuts(settings.redis_url.get_secret_value(), settings.redis_prefix,
                         Revoked())


def build_admin_routes(settings: Settings, store: SessionStore,
                       blobs: BlobStore | None = None,
                       signouts: SignOuts | None = None) -> list[web.RouteDef]:
    """The session viewer under ``/admin``, only when ``GATEWAY_ADMIN_TOKEN`` is set."""
    if settings.admin_token is None or not settings.admin_token.get_secret_value():
        return []
    from app.admin import Access, AdminSite

    return AdminSite(store, Access(settings.admin_token.get_secret_value()),
                     prices=load_prices(settings.prices_file), blobs=blobs,
                     proxies=TrustedProxies.parse(settings.trusted_proxies),
                     signouts=signouts).routes()
