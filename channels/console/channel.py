"""The console channel behind ``gateway chat``: a terminal REPL over the gateway's router.

Each input line is one message; the REPL waits for its reply (deltas printed as they stream,
then a newline) before it reads the next line. ``/attach PATH [text]`` sends a file (a
photo, a PDF, a voice note, a text file) with an optional text (quote a path with spaces);
a file the agent sends is printed with its name, type and size (and its text). ``/session``
prints the session id and the replay command; ``/quit`` or the end of input ends the chat
and asks the gateway to stop.

Input is read by a daemon thread with ``os.read`` on the stdin file descriptor, so a TTY, a
pipe and a redirected file all work and the event loop never blocks. A thread blocked in a read
cannot be cancelled; being a daemon, it is left behind when the process exits. It reads the raw
descriptor rather than ``sys.stdin``: a daemon thread parked inside ``sys.stdin.buffer`` holds
its lock, and the interpreter aborts when it flushes stdin at exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import mimetypes
import os
import re
import shlex
import stat
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TextIO

from gateway.edge import commands
from gateway.edge.channel import Accepted, Deliver, ReplySink, RouterClosedError
from gateway.edge.errors import UnavailableError
from gateway.edge.history import History
from gateway.edge.ids import DEFAULT_TENANT, valid_id
from gateway.edge.messages import Attachment, ConversationKey, Inbound, OutboundFile, Sender

log = logging.getLogger(__name__)

CHANNEL = "console"
SENDER_ID = "console-user"
HELP = (commands.help_text() + "\n/attach PATH [text] - send a file (quote a path with spaces)"
        "\n/session - show the session and how to replay it\n/quit - leave (or Ctrl-D)")
# Cc characters except \t: a pasted escape sequence must not reach the session log.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")



def _read_attachment(name: str, limit: int) -> Attachment:
    """The file at ``name`` (blocking: run in a thread). Over ``limit`` it is not read; the
    gateway refuses it, saying why."""
    path = Path(name).expanduser()
    claimed = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    info = path.stat()
    if not stat.S_ISREG(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "not a regular file")
    if info.st_size > limit:
        return Attachment(path.name, claimed, size=info.st_size, problem="too-large")
    data = path.read_bytes()
    return Attachment(path.name, claimed, data, size=len(data))


class ConsoleSink:
    """Prints one reply: deltas as they come, the final text only if nothing streamed.

    Writes are small and go to a terminal or a pipe, so they are done on the loop.
    """

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.streamed = False
        self.done: asyncio.Future[bool] = asyncio.get_running_loop().create_future()

    async def typing(self) -> None:
        return None

    async def delta(self, text: str) -> None:
        if self.done.done() or not text:
            return
        self.streamed = True
        self.out.write(text)
        self.out.flush()

    async def finish(self, text: str) -> None:
        self._end(text, ok=True)

    async def fail(self, text: str) -> None:
        self._end(text, ok=False)

    async def send_file(self, file: OutboundFile) -> None:
        """A file from the agent: its name, type and size, then its text (send_file only
        sends text documents)."""
        if self.done.done():
            return
        head = f"[file {file.name}, {file.media_type}, {len(file.data)} bytes]"
        body = file.data.decode("utf-8", errors="replace")
        self.out.write(("\n" if self.streamed else "") + head + "\n" + body.rstrip("\n") + "\n")
        self.out.flush()

    def _end(self, text: str, *, ok: bool) -> None:
        if self.done.done():
            return
        if not ok:
            self.out.write(("\n" if self.streamed else "") + f"[error] {text}")
        elif not self.streamed:
            self.out.write(text)
        self.out.write("\n")
        self.out.flush()
        self.done.set_result(ok)


class ConsoleChannel:
    """Chat in the terminal; implements ``Channel``. ``on_exit`` is called when the chat ends."""

    name = CHANNEL

    def __init__(
        self,
        *,
        history: History,
        conversation: str = "local",
        tenant: str = DEFAULT_TENANT,
        max_message_chars: int = 16_000,
        max_attachment_bytes: int = 20 * 1024 * 1024,
        stdin_fd: int = 0,
        stdout: TextIO | None = None,
        replay_command: str = "gateway replay {session}",
        on_exit: Callable[[], None] | None = None,
    ) -> None:
        self.history = history
        self.key = ConversationKey(CHANNEL, valid_id(conversation, "conversation"),
                                   tenant=tenant)
        self.max_message_chars = max_message_chars
        self.max_attachment_bytes = max_attachment_bytes
        self.stdin_fd = stdin_fd
        self.out = stdout if stdout is not None else sys.stdout
        self.replay_command = replay_command
        self.on_exit = on_exit
        self.interactive = os.isatty(stdin_fd)
        self._lines: asyncio.Queue[str | None] = asyncio.Queue()
        self._deliver: Deliver | None = None
        self._group: asyncio.TaskGroup | None = None
        self._task: asyncio.Task[None] | None = None
        self._sink: ConsoleSink | None = None
        self._session: str | None = None
        self._messages = 0
        self._closed = False

    async def start(self, deliver: Deliver) -> None:
        """Start reading stdin and the REPL task; returns at once."""
        self._deliver = deliver
        self._group = asyncio.TaskGroup()
        await self._group.__aenter__()
        self._task = self._group.create_task(self._repl())
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._read_lines, args=(loop,), name="console-stdin",
                         daemon=True).start()
        if self.interactive:
            self._write(f"chatting as {self.key.label()}; {HELP}\n")

    def reply_sink(self, inbound: Inbound) -> ReplySink:
        """The sink of the message being answered (the REPL has one at a time)."""
        return self._sink if self._sink is not None else ConsoleSink(self.out)

    def health(self) -> Mapping[str, Any]:
        return {"ok": True, "conversation": self.key.label(), "messages": self._messages}

    async def aclose(self) -> None:
        """Stop the REPL (idempotent); the stdin thread is a daemon and is left alone."""
        if self._closed:
            return
        self._closed = True
        if self._task is not None:
            self._task.cancel()
        group, self._group = self._group, None
        if group is not None:
            await group.__aexit__(None, None, None)

    # -- input --------------------------------------------------------------------------------

    def _read_lines(self, loop: asyncio.AbstractEventLoop) -> None:
        pending = b""
        try:
            while chunk := os.read(self.stdin_fd, 65536):
                *lines, pending = (pending + chunk).split(b"\n")
                for line in lines:
                    self._post(loop, line.decode("utf-8", "replace"))
        except OSError:  # stdin closed under us: same as the end of input
            pass
        finally:
            if pending:
                self._post(loop, pending.decode("utf-8", "replace"))
            self._post(loop, None)

    def _post(self, loop: asyncio.AbstractEventLoop, item: str | None) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody listens
            loop.call_soon_threadsafe(self._lines.put_nowait, item)

    # -- the REPL -----------------------------------------------------------------------------

    async def _repl(self) -> None:
        try:
            while True:
                if self.interactive:
                    self._write("> ")
                line = await self._lines.get()
                if line is None:
                    break
                text = _CONTROL.sub("", line.rstrip("\r\n")).strip()
                if not text:
                    continue
                if text in ("/quit", "/exit"):
                    break
                if text == "/session":
                    await self._show_session()
                elif text == "/help":
                    self._write(HELP + "\n")
                elif text == "/attach" or text.startswith("/attach "):
                    attached = await self._attachment(text)
                    if attached is not None and not await self._say(*attached):
                        break
                elif not await self._say(text):
                    break
        except Exception:  # the chat ends either way; say why once
            log.exception("console: the chat loop failed")
        finally:
            if self.on_exit is not None:
                self.on_exit()

    async def _attachment(self, line: str) -> tuple[str, tuple[Attachment, ...]] | None:
        """``/attach PATH [text]`` as (text, attachment); None (after saying why) when the file
        cannot be read. A file over the size limit is not read: the gateway refuses it."""
        try:
            words = shlex.split(line)[1:]
        except ValueError as exc:
            self._write(f"[error] /attach: {exc}\n")
            return None
        if not words:
            self._write("[error] usage: /attach PATH [text]\n")
            return None
        try:
            attachment = await asyncio.to_thread(_read_attachment, words[0],
                                                 self.max_attachment_bytes)
        except OSError as exc:
            self._write(f"[error] cannot read {words[0]}: {exc.strerror or exc}\n")
            return None
        return " ".join(words[1:]), (attachment,)

    async def _say(self, text: str, attachments: tuple[Attachment, ...] = ()) -> bool:
        """Send one message and wait for its reply; False when the gateway stopped."""
        if len(text) > self.max_message_chars:
            self._write(f"[error] message is {len(text)} characters long; "
                        f"the limit is {self.max_message_chars}\n")
            return True
        assert self._deliver is not None
        sink = ConsoleSink(self.out)
        inbound = Inbound(key=self.key, sender=Sender(id=SENDER_ID), text=text,
                          chat_type="private", received_at=time.time(),
                          attachments=attachments)
        self._sink = sink
        try:
            accepted = await self._deliver(inbound, sink)
        except RouterClosedError:
            self._write("[error] the gateway is shutting down\n")
            return False
        except UnavailableError as exc:
            self._write(f"[error] not recorded ({exc.public}); try again in a moment\n")
            return True
        self._messages += 1
        if not isinstance(accepted, Accepted):  # access control refused it (and said why)
            self._sink = None
            return True
        self._session = accepted.session_id or self._session
        try:
            await sink.done
        finally:
            self._sink = None
        return True

    async def _show_session(self) -> None:
        session = self._session or await self.history.current_session(self.key)
        if session is None:
            self._write("no session yet: send a message first\n")
            return
        self._write(f"session {session}\nreplay: {self.replay_command.format(session=session)}\n")

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
