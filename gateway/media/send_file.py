"""The ``send_file`` tool: the model sends the person a text document as a file.

For what reads badly as a chat message: a long code listing, a CSV, a report. The text is
stored in the blob store (so the log refers to it by hash, like any attachment) and handed to
the turn's reply sink, which delivers it the platform's way (Telegram ``sendDocument``, a Slack
upload, a download link in the web chat, a listing in the terminal). The tool call and its
result are recorded like any other; the result carries a reference to the file marked
``sent`` (see :mod:`sessions.attachments`), which is never sent back to a provider.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from gateway.edge.channel import FileSink, ReplySink
from gateway.edge.errors import ChannelError, ToolError
from gateway.edge.messages import ChannelContext, OutboundFile
from gateway.edge.tools import ToolResult
from gateway.media.policy import clean_name
from gateway.media.sniff import text_type
from sessions.attachments import BlobRef, human_size, ref_block
from sessions.blobs import BlobStore
from sessions.errors import BlobWriteError

MAX_FILE_CHARS: Final = 500_000


class SendFileTool:
    """See the module docstring. Implements :class:`gateway.edge.tools.ReplyTool`."""

    name = "send_file"
    description = (
        "Send the person a text document as a file (a long code listing, a CSV, a report) "
        "instead of pasting it into the reply. Give a file name with its extension and the "
        "whole text of the file."
    )
    input_schema: Mapping[str, Any] = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 120,
                     "description": "file name with its extension, e.g. report.csv"},
            "content": {"type": "string", "maxLength": MAX_FILE_CHARS,
                        "description": "the whole text of the file"},
        },
        "required": ["name", "content"],
        "additionalProperties": False,
    }

    server = "gateway"
    remote_name = name

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs

    async def run(self, args: Mapping[str, Any], context: ChannelContext) -> ToolResult:
        raise ToolError("files can only be sent while answering someone")

    async def run_replying(self, args: Mapping[str, Any], context: ChannelContext,
                           sink: ReplySink) -> ToolResult:
        name, content = _arguments(args)
        if not isinstance(sink, FileSink):
            raise ToolError("this conversation's channel cannot receive files")
        data = content.encode("utf-8")
        media_type = text_type(data, name) or "text/plain"
        try:
            digest = await self.blobs.put(context.tenant, data)
        except BlobWriteError as exc:
            raise ToolError(f"the file could not be stored ({exc.kind})") from exc
        try:
            await sink.send_file(OutboundFile(name, media_type, data, digest))
        except ChannelError as exc:
            raise ToolError(f"the file could not be delivered: {exc}") from exc
        ref = BlobRef(digest, name, media_type, len(data))
        return ToolResult(f"Sent {name} ({media_type}, {human_size(len(data))}) to the person.",
                          attachments=(ref_block(ref, sent=True),))


def _arguments(args: Mapping[str, Any]) -> tuple[str, str]:
    extra = sorted(str(k) for k in args if k not in ("name", "content"))
    if extra:
        raise ToolError(f"unexpected argument(s): {', '.join(extra)}")
    name, content = args.get("name"), args.get("content")
    if not isinstance(name, str) or not isinstance(content, str):
        raise ToolError("name and content are required strings")
    if not content:
        raise ToolError("the file is empty")
    if len(content) > MAX_FILE_CHARS:
        raise ToolError(f"the file is longer than {MAX_FILE_CHARS:,} characters")
    return clean_name(name, "file.txt"), content
