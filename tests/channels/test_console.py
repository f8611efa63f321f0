"""``gateway chat`` as a subprocess with piped stdin: replies print, the session replays with the
command it prints (as printed), and it runs beside a gateway serving the same data directory."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson

TIMEOUT = 60


def gateway(args: list[str], cwd: Path, stdin: str = "") -> subprocess.CompletedProcess[str]:
    """Run ``python -m gateway ARGS`` offline, in ``cwd`` (so no .env is picked up)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "ANTHROPIC_",
                                                                     "OPENAI_"))}
    env["GATEWAY_PROVIDER"] = "offline"
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args], input=stdin, capture_output=True, text=True,
        cwd=cwd, env=env, timeout=TIMEOUT, check=False,
    )


def works_as_printed(hint: str, cwd: Path, expected: str) -> None:
    """The shell command ``hint``, run as printed in ``cwd``, succeeds and says ``expected``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GATEWAY_")}
    done = subprocess.run(hint, shell=True, capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=TIMEOUT, check=False)
    assert done.returncode == 0, (hint, done.stderr)
    assert expected in done.stdout


def test_chat_prints_reply_and_records_a_replayable_session(tmp_path: Path) -> None:
    """A piped chat prints the reply and /session; the session is listed and replays."""
    data = tmp_path / "data"
    chat = gateway(["chat", "--data-dir", str(data)], tmp_path, "hello\n/session\n/quit\n")
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert 'You said: "hello"' in lines[0]
    assert lines[1].startswith("session ")
    session = lines[1].removeprefix("session ")
    hint = lines[2].removeprefix("replay: ")
    assert hint.endswith(f" replay {session} --data-dir {data}")
    assert len(lines) == 3
    works_as_printed(hint, tmp_path, f"session {session}")

    listing = gateway(["replay", "--list", "--json", "--data-dir", str(data)], tmp_path)
    assert listing.returncode == 0, listing.stderr
    [info] = orjson.loads(listing.stdout)
    assert (info["id"], info["channel"], info["conversation"]) == (
        session, "console", "console:local")
    assert info["messages"] == 2

    replay = gateway(["replay", session, "--data-dir", str(data)], tmp_path)
    assert replay.returncode == 0, replay.stderr
    assert "calls 1" in replay.stdout
    assert "prompts recorded: yes" in replay.stdout


def test_end_of_input_ends_the_chat_and_conversations_resume(tmp_path: Path) -> None:
    """EOF without /quit ends cleanly; the same --conversation resumes its session."""
    data = tmp_path / "data"
    first = gateway(["chat", "--conversation", "notes", "--data-dir", str(data)], tmp_path,
                    "one")
    assert first.returncode == 0, first.stderr
    assert 'You said: "one"' in first.stdout
    second = gateway(["chat", "--conversation", "notes", "--data-dir", str(data)], tmp_path,
                     "two\n/session\n")
    assert second.returncode == 0, second.stderr
    assert "I can see 3 messages" in second.stdout
    listing = gateway(["replay", "--list", "--json", "--data-dir", str(data)], tmp_path)
    [info] = orjson.loads(listing.stdout)
    assert (info["conversation"], info["messages"]) == ("console:notes", 4)


def test_bad_conversation_name_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """An unsafe --conversation is refused with one line on stderr and exit code 2."""
    chat = gateway(["chat", "--conversation", "../x", "--data-dir", str(tmp_path)], tmp_path)
    assert chat.returncode == 2
    assert chat.stderr.startswith("gateway chat: ")
    assert len(chat.stderr.splitlines()) == 1


def test_attach_sends_files_and_voice_is_transcribed_offline(tmp_path: Path) -> None:
    """``/attach PATH [text]``: a photo is seen, a voice note is transcribed by the offline
    fake, a missing file is one error line; the files are recorded by hash."""
    from tests.fakes import media

    data = tmp_path / "data"
    (tmp_path / "cat photo.jpg").write_bytes(media.jpeg(40, 30))
    (tmp_path / "voice.ogg").write_bytes(media.OGG_VOICE)
    chat = gateway(["chat", "--data-dir", str(data)], tmp_path,
                   '/attach "cat photo.jpg" what is this?\n/attach voice.ogg\n'
                   "/attach nowhere.png\n/quit\n")
    assert chat.returncode == 0, chat.stderr
    lines = chat.stdout.splitlines()
    assert 'You said: "what is this?"' in lines[0]
    assert lines[0].endswith("It came with 1 image.")
    assert "(offline transcription) a voice message, voice.ogg" in lines[1]
    assert lines[2] == "[error] cannot read nowhere.png: No such file or directory"
    listing = gateway(["replay", "--list", "--json", "--data-dir", str(data)], tmp_path)
    [info] = orjson.loads(listing.stdout)
    turn = gateway(["replay", info["id"], "--turn", "1", "--data-dir", str(data)], tmp_path)
    assert "<attachment cat photo.jpg image/jpeg" in turn.stdout
    assert len(list((data / "blobs").rglob("*"))) == 4  # two shard folders, two blobs


async def test_chat_beside_a_running_gateway(tmp_path: Path) -> None:
    """With `gateway run` serving the data directory, `gateway chat` says in one line that it
    uses its own (<data>/chat), answers, and its replay hint works as printed; the running
    gateway keeps serving (its control socket still answers)."""
    import asyncio
    import re

    from app.control import served

    data = tmp_path / "data"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GATEWAY_", "ANTHROPIC_",
                                                                     "OPENAI_"))}
    env["GATEWAY_PROVIDER"] = "offline"
    running = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway", "run", "--port", "0", "--data-dir", str(data),
        cwd=tmp_path, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    assert running.stderr is not None
    try:
        async with asyncio.timeout(TIMEOUT):
            while b"gateway listening on" not in await running.stderr.readline():
                pass
        chat = await asyncio.to_thread(gateway, ["chat", "--data-dir", str(data)], tmp_path,
                                       "hello\n/session\n/quit\n")
        still_served = await served(data)
    finally:
        running.terminate()
        await running.wait()
    assert chat.returncode == 0, chat.stderr
    assert chat.stderr.splitlines() == [
        f"gateway chat: a gateway is running on {data}; this chat uses its own data directory, "
        f"{data / 'chat'} (same persona, {data / 'persona'})"]
    lines = chat.stdout.splitlines()
    assert 'You said: "hello"' in lines[0]
    session = lines[1].removeprefix("session ")
    hint = lines[2].removeprefix("replay: ")
    assert re.search(rf" replay {session} --data-dir {re.escape(str(data / 'chat'))}$", hint)
    works_as_printed(hint, tmp_path, f"session {session}")
    assert still_served
    assert running.returncode == 0
