"""``/new`` within the millisecond its conversation's first session started: the conversation
goes on in the new session, for the web history now and for the registry after a restart."""

from __future__ import annotations

from pathlib import Path

from gateway.delivery.history import StoreHistory
from gateway.delivery.registry import ConversationRegistry
from gateway.edge.messages import ChannelContext, ConversationKey
from gateway.edge.metrics import Metrics
from sessions.jsonl import JsonlSessionStore
from tests.sessions.helpers import user

MOMENT = 1788253200.5  # 2026-09-01T09:00:00.500Z, for every creation


def pinned_store(data: Path, ids: list[str]) -> JsonlSessionStore:
    """A store whose clock stands still and whose new ids are ``ids`` in turn (each sorting
    below the one before, as a random id can)."""
    drawn = iter(ids)
    return JsonlSessionStore(data, durability="none", clock=lambda: MOMENT,
                             new_id=lambda: next(drawn))


async def test_new_in_the_same_millisecond_goes_on_in_the_new_session(tmp_path: Path) -> None:
    """First message, then ``/new`` in the same millisecond, then a message in the new session:
    the history shows the new session; after a restart the registry resumes it, with that
    message, not the first session."""
    ada, where = ConversationKey("web", "ada"), ChannelContext("web", "private", "ada")
    store = pinned_store(tmp_path, ["20260901-090000-ffffff", "20260901-090000-000000"])
    registry = ConversationRegistry(store, Metrics(), clock=lambda: MOMENT)
    first = await registry.get(ada, where)
    await first.receive(user("hello"))
    fresh = await registry.rotate(ada, where)
    await fresh.receive(user("start over"))
    assert (first.session_id, fresh.session_id) == (
        "20260901-090000-ffffff", "20260901-090000-000000")
    page = await StoreHistory(store).page(ada, 0, 10)
    assert (page.session, [item.text for item in page.items]) == (
        fresh.session_id, ["start over"])
    await registry.aclose()

    restarted = ConversationRegistry(JsonlSessionStore(tmp_path, durability="none"), Metrics(),
                                     clock=lambda: MOMENT)
    resumed = await restarted.get(ada, where)
    assert (resumed.session_id, resumed.messages) == (fresh.session_id, [user("start over")])
    await restarted.aclose()
