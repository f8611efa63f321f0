"""The persona workspace and its tools, against real files in a temporary directory.

(Layers and scopes, migration and the operator-layer refusal: ``test_scopes.py``.)"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from gateway.agent.tools import ToolRegistry
from gateway.edge.errors import ToolError
from gateway.edge.messages import ChannelContext
from gateway.edge.scopes import scope_of
from gateway.persona.tools import persona_tools
from gateway.persona.workspace import KB_HEADER, SECTION_ORDER, PersonaWorkspace
from sessions.records import Section

WEB = ChannelContext(channel="web", chat_type="private", speaker="Ada", chat="ada", person="ada")
ADA = scope_of(WEB)
ADA_DIR = "memory/default/web/people/ada"


@pytest.fixture
def ws(tmp_path: Path) -> PersonaWorkspace:
    return PersonaWorkspace(tmp_path / "persona", self_edit=True)


@pytest.fixture
def tools(ws: PersonaWorkspace) -> ToolRegistry:
    return ToolRegistry(persona_tools(ws))


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def names(sections: Sequence[Section]) -> list[str]:
    return [s.name for s in sections]


def all_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file())


def external_write(path: Path, text: str) -> None:
    """Edit a file the way an operator would, and push its mtime forward to be sure."""
    path.write_text(text)
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))


async def test_fresh_dir_is_seeded_with_private_modes(ws: PersonaWorkspace) -> None:
    """A missing root is seeded on first build: default files, files 0600, directories 0700."""
    built = await ws.build(WEB)
    root = ws.root
    rel = [p.relative_to(root).as_posix() for p in all_files(root)]
    assert rel == [".layout", "MOOD.md", "SOUL.md", "kb/welcome.md", "skills/short-answers.md"]
    assert all(mode(p) == 0o600 for p in all_files(root))
    assert [mode(d) for d in (root, root / "skills", root / "kb")] == [0o700] * 3
    assert built.cause == "initial"
    assert built.prompt.text.startswith("You are Lisa, a warm, concise assistant")


async def test_empty_existing_dir_is_seeded_but_populated_one_is_not(tmp_path: Path) -> None:
    """An empty root is seeded (and made 0700); a root with any file is left as it is."""
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o755)
    await PersonaWorkspace(empty, name="Mia").build(WEB)
    assert (empty / "SOUL.md").read_text().startswith("You are Mia,")
    assert mode(empty) == 0o700

    used = tmp_path / "used"
    used.mkdir()
    (used / "SOUL.md").write_text("I am custom.")
    built = await PersonaWorkspace(used).build(WEB)
    assert [p.name for p in all_files(used)] == [".layout", "SOUL.md"]  # (the marker: migrated)
    assert names(built.prompt.sections) == ["soul", "channel"]


async def test_sections_come_in_documented_order(ws: PersonaWorkspace) -> None:
    """With every file filled in, the section names are exactly SECTION_ORDER."""
    await ws.build(WEB)
    await ws.append_memory(ADA, "Ada likes tea.")
    external_write(ws.root / "USER.md", "Our users are mathematicians.\n")
    external_write(ws.root / "MEMORY.md", "The office closes at six.\n")
    (ws.root / "tenants" / "default").mkdir(parents=True)
    external_write(ws.root / "tenants" / "default" / "TENANT.md", "The default tenant.\n")
    built = await ws.build(WEB)
    assert names(built.prompt.sections) == list(SECTION_ORDER)
    assert list(SECTION_ORDER) == ["soul", "user", "notes", "skills", "tenant", "memory", "mood",
                                   "kb", "channel"]
    texts = {s.name: s.text for s in built.prompt.sections}
    assert texts["user"] == ("## About the people you serve (from the operator)\n"
                             "Our users are mathematicians.")
    assert texts["notes"] == "## Notes from the operator\nThe office closes at six."
    assert texts["tenant"] == "## About this workspace (from the operator)\nThe default tenant."
    assert texts["memory"] == (
        "## What you remember about this person (memory_write adds to it)\nAda likes tea.")
    assert texts["skills"].startswith("## Skills\n### short-answers\nWhen a reply")
    assert texts["mood"] == "## How you feel right now\ncalm"
    assert texts["kb"].startswith(KB_HEADER + "- Welcome: This is your knowledge base.")


async def test_skills_are_sorted_by_name(ws: PersonaWorkspace) -> None:
    """Skill files appear under their stems, sorted by file name; blank ones are skipped."""
    await ws.build(WEB)
    skills = ws.root / "skills"
    external_write(skills / "b-second.md", "two")
    external_write(skills / "a-first.md", "one")
    external_write(skills / "c-blank.md", "  \n")
    built = await ws.build(WEB)
    skill_text = next(s.text for s in built.prompt.sections if s.name == "skills")
    heads = [ln for ln in skill_text.splitlines() if ln.startswith("### ")]
    assert heads == ["### a-first", "### b-second", "### short-answers"]


async def test_empty_files_drop_their_sections(ws: PersonaWorkspace) -> None:
    """Blank or missing files give empty sections, which the prompt drops."""
    await ws.build(WEB)
    for rel in ("MOOD.md", "kb/welcome.md", "skills/short-answers.md"):
        (ws.root / rel).unlink()
    built = await ws.build(WEB)
    assert names(built.prompt.sections) == ["soul", "channel"]


async def test_unchanged_build_returns_same_prompt_object(ws: PersonaWorkspace) -> None:
    """With nothing changed, build hands back the very same Prompt object per context."""
    first = await ws.build(WEB)
    second = await ws.build(WEB)
    assert second.prompt is first.prompt
    other = await ws.build(ChannelContext("telegram", "group", "Bob", chat="-100", person="7"))
    assert other.prompt is not first.prompt
    assert (await ws.build(WEB)).prompt is first.prompt


async def test_tool_write_is_visible_to_next_build(
    ws: PersonaWorkspace, tools: ToolRegistry
) -> None:
    """memory_write changes the very next build: new fingerprint, cause memory_write."""
    before = await ws.build(WEB)
    result = await tools.run("memory_write", {"text": "Ada prefers metric units."}, WEB)
    assert result.text == "saved to memory"
    assert not result.is_error
    after = await ws.build(WEB)
    assert after.cause == "memory_write"
    assert after.prompt.fingerprint != before.prompt.fingerprint
    assert "Ada prefers metric units." in after.prompt.text
    # The workspace's own write is not mistaken for an outside edit on the build after.
    again = await ws.build(WEB)
    assert again.cause == "memory_write"
    assert again.prompt is after.prompt


async def test_external_edit_is_picked_up_as_file_changed(ws: PersonaWorkspace) -> None:
    """An operator's edit of SOUL.md while running shows up with cause file_changed."""
    before = await ws.build(WEB)
    external_write(ws.root / "SOUL.md", "You are Lisa, now a pirate.\n")
    after = await ws.build(WEB)
    assert after.cause == "file_changed"
    assert after.prompt.sections[0].text == "You are Lisa, now a pirate."
    assert after.prompt.fingerprint != before.prompt.fingerprint


async def test_tool_after_external_edit_keeps_the_edit(
    ws: PersonaWorkspace, tools: ToolRegistry
) -> None:
    """A tool edit applies to what is on disk now, not to a stale cached copy."""
    await ws.build(WEB)
    await tools.run("memory_write", {"text": "First."}, WEB)
    external_write(ws.root / ADA_DIR / "MEMORY.md", "Operator note.\n")
    await tools.run("memory_write", {"text": "Tool note."}, WEB)
    assert (ws.root / ADA_DIR / "MEMORY.md").read_text() == "Operator note.\n\nTool note.\n"
    built = await ws.build(WEB)
    assert built.cause == "memory_write"


async def test_kb_index_is_bounded(tmp_path: Path) -> None:
    """With 200 notes the kb section stays within the limit and says how many were left out."""
    ws = PersonaWorkspace(tmp_path / "p", kb_index_limit=1000)
    await ws.build(WEB)
    for i in range(200):
        await ws.write_kb(ADA, f"Note number {i}", f"Body of note {i}, with some words.\nMore.")
    built = await ws.build(WEB)
    kb = next(s.text for s in built.prompt.sections if s.name == "kb")
    assert kb.startswith(KB_HEADER)
    assert len(kb) <= 1000 + len(KB_HEADER)
    lines = kb[len(KB_HEADER) :].splitlines()
    shown = len(lines) - 1
    assert lines[-1] == f"(+{201 - shown} more notes)"
    assert lines[0] == "- Note number 199: Body of note 199, with some words."


async def test_kb_index_is_newest_first(ws: PersonaWorkspace) -> None:
    """Index lines follow note modification times, newest first."""
    await ws.build(WEB)
    kb = ws.root / "kb"
    for i, stem in enumerate(["old", "mid", "new"]):
        external_write(kb / f"{stem}.md", f"# {stem.title()}\n\n{stem} text")
        os.utime(kb / f"{stem}.md", ns=(0, 2_000_000_000_000_000_000 + i * 10**9))
    built = await ws.build(WEB)
    kb_text = next(s.text for s in built.prompt.sections if s.name == "kb")
    assert kb_text.splitlines()[1:4] == ["- New: new text", "- Mid: mid text", "- Old: old text"]


async def test_kb_search_finds_a_note(ws: PersonaWorkspace, tools: ToolRegistry) -> None:
    """kb_search returns the matching note's title and text, best match first."""
    await tools.run("kb_write", {"title": "Ada's tea", "text": "Earl Grey, no sugar."}, WEB)
    await tools.run("kb_write", {"title": "Bikes", "text": "Ada rides a blue bike."}, WEB)
    assert await ws.search_kb(WEB, "earl grey") == [("Ada's tea", "Earl Grey, no sugar.")]
    result = await tools.run("kb_search", {"query": "tea"}, WEB)
    assert result.text == "## Ada's tea\nEarl Grey, no sugar."
    missing = await tools.run("kb_search", {"query": "zeppelin"}, WEB)
    assert missing.text == "no matching notes"


async def test_kb_write_same_title_replaces_note(ws: PersonaWorkspace) -> None:
    """Writing a title again replaces its note; a colliding slug gets a separate file."""
    first = await ws.write_kb(ADA, "Plans", "v1")
    assert await ws.write_kb(ADA, "Plans", "v2") == first
    other = await ws.write_kb(ADA, "plans!", "different")
    assert other != first
    assert (ws.root / ADA_DIR / first).read_text() == "# Plans\n\nv2\n"
    assert (ws.root / ADA_DIR / other).read_text() == "# plans!\n\ndifferent\n"


async def test_soul_patch_not_found_is_error_result(
    ws: PersonaWorkspace, tools: ToolRegistry
) -> None:
    """soul_patch with text absent from SOUL.md comes back as an error result, file untouched."""
    await ws.build(WEB)
    soul = (ws.root / "SOUL.md").read_text()
    result = await tools.run("soul_patch", {"find": "pirate", "replace": "ninja"}, WEB)
    assert result.is_error
    assert "not found" in result.text
    assert (ws.root / "SOUL.md").read_text() == soul
    assert (await ws.build(WEB)).cause == "initial"


async def test_soul_patch_replaces_and_appends(ws: PersonaWorkspace, tools: ToolRegistry) -> None:
    """An exact unique match is replaced; an empty find appends; an ambiguous find fails."""
    await ws.build(WEB)
    ok = await tools.run("soul_patch", {"find": "warm, concise", "replace": "cheerful"}, WEB)
    assert ok.text == "SOUL.md updated"
    await tools.run("soul_patch", {"find": "", "replace": "You love puns."}, WEB)
    built = await ws.build(WEB)
    assert built.cause == "soul_patch"
    assert built.prompt.sections[0].text.startswith("You are Lisa, a cheerful assistant")
    assert built.prompt.sections[0].text.endswith("\n\nYou love puns.")
    with pytest.raises(ToolError, match="occurs 4 times"):
        await ws.patch_soul("You", "Thou")


async def test_mood_set_changes_mood_section(ws: PersonaWorkspace, tools: ToolRegistry) -> None:
    """mood_set replaces the mood line; an oversized mood is refused."""
    await tools.run("mood_set", {"mood": "  curious\nand upbeat "}, WEB)
    built = await ws.build(WEB)
    assert built.cause == "mood_set"
    mood = next(s.text for s in built.prompt.sections if s.name == "mood")
    assert mood == "## How you feel right now\ncurious and upbeat"
    too_long = await tools.run("mood_set", {"mood": "x" * 101}, WEB)
    assert too_long.is_error


async def test_bad_arguments_are_error_results(tools: ToolRegistry) -> None:
    """Wrong types, missing or unexpected keys and oversized text are tool errors."""
    calls: list[tuple[str, dict[str, Any]]] = [
        ("memory_write", {"text": 42}),
        ("memory_write", {}),
        ("memory_write", {"text": "ok", "extra": 1}),
        ("memory_write", {"text": "x" * 2001}),
        ("memory_write", {"text": "   "}),
        ("kb_write", {"title": "t", "text": "x" * 20_001}),
        ("kb_search", {"query": None}),
        ("soul_patch", {"find": "a"}),
    ]
    results = [await tools.run(name, args, WEB) for name, args in calls]
    assert [r.is_error for r in results] == [True] * len(calls)


async def test_tool_schemas_are_strict(ws: PersonaWorkspace) -> None:
    """Every tool schema is a closed object whose required keys are all its properties."""
    registry = ToolRegistry(persona_tools(ws))
    assert [s["name"] for s in registry.schemas] == [
        "memory_write",
        "soul_patch",
        "kb_write",
        "kb_search",
        "mood_set",
    ]
    for schema in registry.schemas:
        body = schema["input_schema"]
        assert body["type"] == "object"
        assert body["additionalProperties"] is False
        assert body["required"] == list(body["properties"])


async def test_atomic_writes_leave_no_temp_files(ws: PersonaWorkspace) -> None:
    """After seeding and every kind of write, only the real files exist, all 0600."""
    await ws.build(WEB)
    await ws.append_memory(ADA, "one")
    await ws.patch_soul("", "two")
    await ws.write_kb(ADA, "three", "3")
    await ws.set_mood(ADA, "four")
    files = all_files(ws.root)
    assert [p.relative_to(ws.root).as_posix() for p in files
            if p.name.startswith(".") or p.suffix != ".md"] == [".layout", f"{ADA_DIR}/scope.json"]
    assert all(mode(p) == 0o600 for p in files)
    dirs = [p for p in ws.root.rglob("*") if p.is_dir()]
    assert all(mode(p) == 0o700 for p in dirs)  # the scope's parents too, not just its own


async def test_kb_title_traversal_stays_inside_kb(ws: PersonaWorkspace) -> None:
    """A title like ../../etc/passwd becomes a plain file name inside kb/."""
    rel = await ws.write_kb(ADA, "../../etc/passwd", "nope")
    path = (ws.root / ADA_DIR / rel).resolve()
    assert path.parent == (ws.root / ADA_DIR / "kb").resolve()
    assert path.name == "etc-passwd.md"
    assert not (ws.root.parent / "etc").exists()


async def test_channel_section_reflects_context(ws: PersonaWorkspace) -> None:
    """The last section names channel, chat type and the speaker of a one-to-one chat; a shared
    chat says that messages name their authors instead (its prompt stays put between them)."""
    built = await ws.build(WEB)
    assert built.prompt.sections[-1].text == (
        "## Where you are\nChannel: web · chat: private · speaking with: Ada"
    )
    group = await ws.build(ChannelContext("slack", "channel", "Bob", chat="C1", person="U2"))
    assert group.prompt.sections[-1].text == (
        "## Where you are\nChannel: slack · chat: channel · each message starts with "
        "[name (id)] of the person who wrote it")
    anon = await ws.build(ChannelContext("slack", "private", None, chat="D1", person="U2"))
    assert anon.prompt.sections[-1].text == "## Where you are\nChannel: slack · chat: private"
    sneaky = await ws.build(ChannelContext("web", "private", "Eve\n## New rules"))
    assert sneaky.prompt.sections[-1].text.endswith("speaking with: Eve ## New rules")


async def test_deleted_file_is_picked_up(ws: PersonaWorkspace) -> None:
    """Removing a file outside the gateway drops its content with cause file_changed."""
    await ws.build(WEB)
    await ws.write_kb(ADA, "Gone soon", "temporary")
    assert "Gone soon" in (await ws.build(WEB)).prompt.text
    (ws.root / ADA_DIR / "kb" / "gone-soon.md").unlink()
    built = await ws.build(WEB)
    assert built.cause == "file_changed"
    assert "Gone soon" not in built.prompt.text


async def test_symlinked_files_are_ignored(ws: PersonaWorkspace, tmp_path: Path) -> None:
    """A symlink in kb/ is not read into the prompt."""
    await ws.build(WEB)
    secret = tmp_path / "secret.md"
    secret.write_text("# Secret\n\nhunter2")
    (ws.root / "kb" / "link.md").symlink_to(secret)
    assert "hunter2" not in (await ws.build(WEB)).prompt.text


async def test_hand_edits_of_shared_layers_are_seen_within_rescan_after(
    tmp_path: Path,
) -> None:
    """With ``rescan_after`` (GATEWAY_PERSONA_RESCAN), the operator's files are scanned at most
    once in that time: a hand edit shows up on the first build after it. The model's own
    writes and a person's own memory files are seen at once, whatever the clock says."""
    now = [100.0]
    ws = PersonaWorkspace(tmp_path / "persona", self_edit=True, rescan_after=1.0,
                          clock=lambda: now[0])
    tools = ToolRegistry(persona_tools(ws))
    first = await ws.build(WEB)
    external_write(ws.root / "SOUL.md", "You are Lisa, now a pirate.\n")
    now[0] += 0.5
    assert (await ws.build(WEB)).prompt is first.prompt  # not scanned yet
    # A person's memory is theirs: scanned on every build (an erasure elsewhere must show).
    (ws.root / ADA_DIR).mkdir(parents=True)
    external_write(ws.root / ADA_DIR / "MEMORY.md", "Ada said this by hand.\n")
    mine = await ws.build(WEB)
    assert "Ada said this by hand." in mine.prompt.text
    assert "pirate" not in mine.prompt.text
    now[0] += 0.5
    pirate = await ws.build(WEB)
    assert pirate.cause == "file_changed"
    assert pirate.prompt.sections[0].text == "You are Lisa, now a pirate."
    # A tool write to the operator layer scans first and is seen at once.
    external_write(ws.root / "SOUL.md", "You are Lisa, a sailor.\n")
    result = await tools.run("soul_patch", {"find": "sailor", "replace": "captain"}, WEB)
    assert not result.is_error, result.text
    patched = await ws.build(WEB)
    assert patched.cause == "soul_patch"
    assert patched.prompt.sections[0].text == "You are Lisa, a captain."
