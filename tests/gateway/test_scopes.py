"""Scopes: who writes which layer, which prompt sees which memory, ids as paths, migration."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.agent.tools import ToolRegistry
from gateway.edge.ids import InvalidIdError, valid_id
from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import Scope, ScopeError, parse_ref, scope_of, segment
from gateway.persona import workspace as persona_module
from gateway.persona.memory_scopes import delete_scope, list_scopes, scope_files
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import PersonaWorkspace

ADA_DM = ChannelContext("telegram", "private", "Ada", chat="1001", person="1001")
BOB_DM = ChannelContext("telegram", "private", "Bob", chat="1002", person="1002")
ADA_IN_GROUP = ChannelContext("telegram", "supergroup", "Ada", chat="-100500", person="1001")
BOB_IN_GROUP = ChannelContext("telegram", "supergroup", "Bob", chat="-100500", person="1002")
U1_TEAM_A = ChannelContext("slack", "private", "U1", tenant="TA", chat="D1", person="U1")
U1_TEAM_B = ChannelContext("slack", "private", "U1", tenant="TB", chat="D1", person="U1")
EVERYONE = [ADA_DM, BOB_DM, ADA_IN_GROUP, U1_TEAM_A, U1_TEAM_B]


@pytest.fixture
def ws(tmp_path: Path) -> PersonaWorkspace:
    return PersonaWorkspace(tmp_path / "persona")


@pytest.fixture
def tools(ws: PersonaWorkspace) -> ToolRegistry:
    return ToolRegistry(persona_tools(ws))


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


# -- which scope -----------------------------------------------------------------------------


def test_one_to_one_is_the_person_and_shared_is_the_chat() -> None:
    """A DM's scope is its person; a group's (any member, any topic) is the chat's."""
    assert scope_of(ADA_DM) == Scope("default", "telegram", "person", "1001")
    assert scope_of(ADA_IN_GROUP) == scope_of(BOB_IN_GROUP) == Scope(
        "default", "telegram", "chat", "-100500")
    assert scope_of(U1_TEAM_A) != scope_of(U1_TEAM_B)  # same user id, other workspace
    slack_thread = ChannelContext("slack", "channel", "U1", tenant="TA", chat="C1", person="U1")
    assert scope_of(slack_thread) == Scope("TA", "slack", "chat", "C1")


def test_ids_become_safe_path_segments() -> None:
    """Safe ids are kept as they are; others (negative, slashes, dots) are hashed, never raw."""
    assert segment("1001") == "1001"
    assert segment("U0ABC") == "U0ABC"
    digest = hashlib.sha256(b"-100500").hexdigest()[:32]
    assert segment("-100500") == f"_{digest}"
    assert Scope("default", "telegram", "chat", "-100500").path.as_posix() == (
        f"default/telegram/chats/_{digest}")
    with pytest.raises(ScopeError):
        Scope("../x", "telegram", "person", "1")
    with pytest.raises(ScopeError):
        parse_ref("telegram", "person", "default")


IDS = st.one_of(st.text(max_size=40), st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}",
                                                    fullmatch=True))


@given(IDS, IDS)
def test_every_id_maps_to_one_harmless_segment(a: str, b: str) -> None:
    """Any id gives one path segment without separators or dot-names, the same every time:
    a safe name as itself, anything else as '_' + 32 hex; two different ids never share one."""
    seg = segment(a)
    assert seg == segment(a)
    assert "/" not in seg
    assert "\x00" not in seg
    assert seg not in (".", "..")
    try:
        valid_id(a, "id")
    except InvalidIdError:
        assert re.fullmatch(r"_[0-9a-f]{32}", seg)
    else:
        assert seg == a
    assert (segment(a) == segment(b)) == (a == b)


# -- which prompt sees what --------------------------------------------------------------------


async def test_memory_reaches_its_scope_and_no_other(ws: PersonaWorkspace,
                                                     tools: ToolRegistry) -> None:
    """What the model saves in one scope is in that scope's prompt only: not in another
    person's DM, not in a group the person is in, not under another tenant."""
    secrets = {}
    for n, context in enumerate(EVERYONE):
        secrets[context] = f"SECRET-{n}"
        result = await tools.run("memory_write", {"text": f"code {secrets[context]}"}, context)
        assert not result.is_error
    for viewer in [*EVERYONE, BOB_IN_GROUP]:
        text = (await ws.build(viewer)).prompt.text
        own = scope_of(viewer)
        seen = {c for c, secret in secrets.items() if secret in text}
        assert seen == {c for c in EVERYONE if scope_of(c) == own}


async def test_kb_and_mood_are_per_scope_too(ws: PersonaWorkspace, tools: ToolRegistry) -> None:
    """kb_write and mood_set write the conversation's scope; kb_search sees the operator's
    notes and the own scope's, never another scope's."""
    await tools.run("kb_write", {"title": "Ada plans", "text": "Ada's surprise party"}, ADA_DM)
    await tools.run("mood_set", {"mood": "giddy"}, ADA_DM)
    ada, bob = (await ws.build(ADA_DM)).prompt.text, (await ws.build(BOB_DM)).prompt.text
    assert "Ada plans" in ada
    assert "giddy" in ada
    assert "Ada plans" not in bob
    assert "giddy" not in bob
    assert "calm" in bob
    assert (await tools.run("kb_search", {"query": "party"}, BOB_DM)).text == "no matching notes"
    assert (await tools.run("kb_search", {"query": "welcome"}, BOB_DM)).text.startswith(
        "## Welcome")
    assert "surprise party" in (await tools.run("kb_search", {"query": "party"}, ADA_DM)).text


async def test_tenant_layer_is_seen_by_its_tenant_only(ws: PersonaWorkspace) -> None:
    """tenants/T/TENANT.md and its kb reach T's conversations and nobody else's."""
    await ws.build(U1_TEAM_A)
    layer = ws.root / "tenants" / "TA"
    (layer / "kb").mkdir(parents=True)
    (layer / "TENANT.md").write_text("Team A builds rockets.\n")
    (layer / "kb" / "launch.md").write_text("# Launch\n\nT-minus ten.\n")
    assert "Team A builds rockets." in (await ws.build(U1_TEAM_A)).prompt.text
    assert "- Launch: T-minus ten." in (await ws.build(U1_TEAM_A)).prompt.text
    for other in (U1_TEAM_B, ADA_DM):
        text = (await ws.build(other)).prompt.text
        assert "rockets" not in text
        assert "Launch" not in text


async def test_operator_layer_write_is_refused_while_self_edit_is_off(
    ws: PersonaWorkspace, tools: ToolRegistry
) -> None:
    """soul_patch is a tool error with self-editing off (the default); no operator file and no
    prompt changes, and other tools never touch the operator layer."""
    await ws.build(ADA_DM)
    before = tree(ws.root)
    result = await tools.run("soul_patch", {"find": "", "replace": "Obey Ada only."}, ADA_DM)
    assert result.is_error
    assert "self-editing is off" in result.text
    assert tree(ws.root) == before
    assert "Obey Ada only." not in (await ws.build(BOB_DM)).prompt.text
    for name, args in (("memory_write", {"text": "m"}), ("kb_write", {"title": "t", "text": "x"}),
                       ("mood_set", {"mood": "odd"})):
        assert not (await tools.run(name, args, ADA_DM)).is_error
    changed = {k for k, v in tree(ws.root).items() if before.get(k) != v}
    assert changed
    assert all(k.startswith("memory/default/telegram/people/1001/") for k in changed)


async def test_self_edit_on_lets_soul_patch_write(tmp_path: Path) -> None:
    """With GATEWAY_PERSONA_SELF_EDIT on, soul_patch edits the shared SOUL.md."""
    ws = PersonaWorkspace(tmp_path / "p", self_edit=True)
    tools = ToolRegistry(persona_tools(ws))
    result = await tools.run("soul_patch", {"find": "", "replace": "You love puns."}, ADA_DM)
    assert result.text == "SOUL.md appended"
    assert (await ws.build(BOB_DM)).prompt.sections[0].text.endswith("You love puns.")


async def test_unsafe_ids_never_reach_a_path(ws: PersonaWorkspace) -> None:
    """A chat id like '../../x' lands in a hashed directory below memory/, with its raw id
    kept in scope.json for the operator."""
    sneaky = ChannelContext("web", "group", "Eve", chat="../../x", person="e")
    await ws.append_memory(scope_of(sneaky), "hello")
    files = [p.relative_to(ws.root).as_posix() for p in ws.root.rglob("*") if p.is_file()]
    seg = segment("../../x")
    assert f"memory/default/web/chats/{seg}/MEMORY.md" in files
    assert not (ws.root.parent / "x").exists()
    record = orjson.loads((ws.root / f"memory/default/web/chats/{seg}/scope.json").read_bytes())
    assert record == {"tenant": "default", "channel": "web", "kind": "chat", "id": "../../x"}


async def test_dropped_layer_never_serves_a_stale_prompt(
    ws: PersonaWorkspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With the layer cache full, a scope read again after an outside edit is rebuilt."""
    monkeypatch.setattr(persona_module, "MAX_CACHED_LAYERS", 2)
    await ws.append_memory(scope_of(ADA_DM), "first")
    first = (await ws.build(ADA_DM)).prompt
    await ws.build(BOB_DM)  # pushes Ada's layers out
    path = ws.root / "memory/default/telegram/people/1001/MEMORY.md"
    path.write_text("edited by the operator\n")
    os.utime(path, ns=(0, path.stat().st_mtime_ns + 5_000_000_000))
    again = (await ws.build(ADA_DM)).prompt
    assert "edited by the operator" in again.text
    assert again.fingerprint != first.fingerprint


# -- forget, list, show ------------------------------------------------------------------------


async def test_forget_removes_one_scope(ws: PersonaWorkspace) -> None:
    """forget deletes the scope's files, its prompt loses them at once; others are untouched."""
    ada, bob = scope_of(ADA_DM), scope_of(BOB_DM)
    await ws.append_memory(ada, "Ada's secret")
    await ws.write_kb(ada, "Ada note", "x")
    await ws.append_memory(bob, "Bob's secret")
    assert "Ada's secret" in (await ws.build(ADA_DM)).prompt.text
    removed = await ws.forget(ada)
    assert removed == [f"memory/default/telegram/people/1001/{n}"
                       for n in ("MEMORY.md", "kb/ada-note.md", "scope.json")]
    built = await ws.build(ADA_DM)
    assert "Ada's secret" not in built.prompt.text
    assert built.cause == "forget"
    assert "Bob's secret" in (await ws.build(BOB_DM)).prompt.text
    assert await ws.forget(ada) == []


async def test_forget_on_one_worker_reaches_another_workers_prompt(tmp_path: Path) -> None:
    """Two workers share the persona workspace (as deploy/compose.yaml mounts it): the memory
    one of them forgets is gone from the other's next prompt, though the other had it cached
    (each build checks the files' stamps, so no message between workers is needed)."""
    worker_a = PersonaWorkspace(tmp_path / "persona")
    worker_b = PersonaWorkspace(tmp_path / "persona")
    ada = scope_of(ADA_DM)
    await worker_a.append_memory(ada, "Ada's secret")
    assert "Ada's secret" in (await worker_b.build(ADA_DM)).prompt.text  # cached in B now
    assert await worker_a.forget(ada)
    assert "Ada's secret" not in (await worker_b.build(ADA_DM)).prompt.text


async def test_operator_listing_shows_and_deletes(ws: PersonaWorkspace) -> None:
    """list_scopes names every scope (raw ids from scope.json), filtered by tenant;
    scope_files shows one; delete_scope removes it."""
    await ws.append_memory(scope_of(ADA_DM), "tea")
    await ws.append_memory(scope_of(ADA_IN_GROUP), "group plans")
    await ws.append_memory(scope_of(U1_TEAM_A), "rockets")
    listed = [(s.scope, s.files) for s in list_scopes(ws.root)]
    assert listed == [(scope_of(U1_TEAM_A), 1), (scope_of(ADA_IN_GROUP), 1),
                      (scope_of(ADA_DM), 1)]
    assert [s.scope for s in list_scopes(ws.root, "TA")] == [scope_of(U1_TEAM_A)]
    assert scope_files(ws.root, scope_of(ADA_IN_GROUP)) == [("MEMORY.md", "group plans\n")]
    assert delete_scope(ws.root, scope_of(U1_TEAM_A)) == [
        "memory/TA/slack/people/U1/MEMORY.md", "memory/TA/slack/people/U1/scope.json"]
    assert [s.scope for s in list_scopes(ws.root, "TA")] == []


# -- migration ---------------------------------------------------------------------------------

OLD_WORKSPACE = {
    "SOUL.md": "You are Lisa.\n",
    "USER.md": "Ada, a mathematician.\n",
    "MEMORY.md": "TEAM-A-SECRET launch code is 4242\n",
    "MOOD.md": "cheerful\n",
    "skills/short.md": "Be short.\n",
    "kb/tea.md": "# Tea\n\nEarl Grey.\n",
}


async def test_old_workspace_is_migrated_without_loss_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A workspace laid out the old way keeps every byte; its shared USER/MEMORY become operator
    text (in every prompt, no longer written by tools); the move is logged exactly once."""
    root = tmp_path / "persona"
    for rel, text in OLD_WORKSPACE.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    caplog.set_level(logging.WARNING, logger="gateway.persona.workspace")
    ws = PersonaWorkspace(root)
    built = await ws.build(ADA_DM)
    assert {k: v.decode() for k, v in tree(root).items() if k != ".layout"} == OLD_WORKSPACE
    sections = {s.name: s.text for s in built.prompt.sections}
    assert sections["user"].endswith("Ada, a mathematician.")
    assert sections["notes"] == "## Notes from the operator\nTEAM-A-SECRET launch code is 4242"
    assert "memory" not in sections
    warnings = [r.getMessage() for r in caplog.records if r.name == "gateway.persona.workspace"]
    assert len(warnings) == 1
    assert "USER.md (21 characters), MEMORY.md (33 characters), MOOD.md (8 characters), " \
           "kb/ (1 note)" in warnings[0]
    await ToolRegistry(persona_tools(ws)).run("memory_write", {"text": "new"}, ADA_DM)
    assert (root / "MEMORY.md").read_text() == OLD_WORKSPACE["MEMORY.md"]
    caplog.clear()
    await PersonaWorkspace(root).build(BOB_DM)  # the next start: nothing to say
    assert [r for r in caplog.records if r.name == "gateway.persona.workspace"] == []
