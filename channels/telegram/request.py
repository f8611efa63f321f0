"""PTB's Bot API transport over aiohttp, the HTTP stack the gateway already runs.

python-telegram-bot talks to the Bot API through a :class:`telegram.request.BaseRequest`
(its ``request=`` seam). Its default, ``HTTPXRequest``, goes through httpx, httpcore and
anyio: with PTB itself, about a third of the event loop's CPU time per message on the Telegram
path (issue 15; more than the provider SDK). The same requests over one aiohttp
``ClientSession`` per request object cost markedly less (``bench/RESULTS.md``, Telegram), and
the gateway runs aiohttp anyway (its HTTP server, the provider SDKs' transport).

What PTB asks of a transport, kept as ``HTTPXRequest`` does it: parameters go form-encoded
(PTB has already JSON-encoded each value), files as ``multipart/form-data`` beside them; the
four timeouts per call, defaulting to the constructor's (a call with files gets
``media_write_timeout`` for writing); a timeout raises :class:`telegram.error.TimedOut`, any other
transport failure :class:`telegram.error.NetworkError`; the answer is the status and the raw
body, which PTB parses and turns into its errors.

aiohttp has no separate write timeout: the body is written within ``total``, which is the sum
of the connect, pool, write and read timeouts whenever none of them is ``None`` (so a stalled
upload still ends); ``sock_read`` bounds each wait for the answer.
"""

from __future__ import annotations

from urllib.parse import urlencode

import aiohttp
from telegram._utils.defaultvalue import DefaultValue  # PTB's own transports use these two
from telegram._utils.types import ODVInput
from telegram.error import NetworkError, TimedOut
from telegram.request import BaseRequest, RequestData

FORM_HEADERS = {"Content-Type": "application/x-www-form-urlencoded"}

ODVFloat = ODVInput[float]


class AiohttpRequest(BaseRequest):
    """A :class:`~telegram.request.BaseRequest` over one aiohttp session; see the module
    docstring. Timeouts in seconds (``None``: no limit)."""

    __slots__ = ("_connect", "_limit", "_media_write", "_pool", "_read", "_session", "_write")

    def __init__(self, connection_pool_size: int = 8, *, read_timeout: float | None = 5.0,
                 write_timeout: float | None = 5.0, connect_timeout: float | None = 5.0,
                 pool_timeout: float | None = 1.0,
                 media_write_timeout: float | None = 20.0) -> None:
        self._limit = connection_pool_size
        self._read = read_timeout
        self._write = write_timeout
        self._connect = connect_timeout
        self._pool = pool_timeout
        self._media_write = media_write_timeout
        self._session: aiohttp.ClientSession | None = None

    @property
    def read_timeout(self) -> float | None:
        return self._read

    async def initialize(self) -> None:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit),
                headers={"User-Agent": self.USER_AGENT},
                # PTB never follows redirects or keeps cookies; neither does this.
                cookie_jar=aiohttp.DummyCookieJar(),
            )

    async def shutdown(self) -> None:
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()

    async def do_request(
        self,
        url: str,
        method: str,
        request_data: RequestData | None = None,
        read_timeout: ODVFloat = BaseRequest.DEFAULT_NONE,
        write_timeout: ODVFloat = BaseRequest.DEFAULT_NONE,
        connect_timeout: ODVFloat = BaseRequest.DEFAULT_NONE,
        pool_timeout: ODVFloat = BaseRequest.DEFAULT_NONE,
    ) -> tuple[int, bytes]:
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        files = request_data.multipart_data if request_data else None
        params = request_data.json_parameters if request_data else None
        read = self._read if isinstance(read_timeout, DefaultValue) else read_timeout
        connect = self._connect if isinstance(connect_timeout, DefaultValue) else connect_timeout
        pool = self._pool if isinstance(pool_timeout, DefaultValue) else pool_timeout
        write = ((self._media_write if files else self._write)
                 if isinstance(write_timeout, DefaultValue) else write_timeout)
        parts = (connect, pool, write, read)
        timeout = aiohttp.ClientTimeout(
            total=None if None in parts else sum(p for p in parts if p is not None),
            # aiohttp's connect covers waiting for a pooled connection and opening one.
            connect=None if connect is None or pool is None else connect + pool,
            sock_connect=connect,
            sock_read=read,
        )
        # Encoded here as PTB's httpx transport does; a dict handed to aiohttp would be wrapped
        # in a FormData, which draws a multipart boundary (uuid4: a getrandom call) per request.
        data: aiohttp.FormData | bytes | None = None
        headers = None
        if params and not files:
            data = urlencode(params).encode()
            headers = FORM_HEADERS
        if files:
            form = aiohttp.FormData()
            for name, value in (params or {}).items():
                form.add_field(name, value)
            for name, (filename, content, mimetype) in files.items():
                form.add_field(name, content, filename=filename, content_type=mimetype)
            data = form
        try:
            async with session.request(method, url, data=data, headers=headers,
                                       timeout=timeout, allow_redirects=False) as response:
                return response.status, await response.read()
        except TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            # The type only: an aiohttp message may quote the URL, which holds the token.
            raise NetworkError(f"aiohttp.{type(exc).__name__}") from exc

    async def download(self, url: str, limit: int, within: float) -> bytes | None:
        """The file at ``url`` (a GET on this session), or None once it passes ``limit``
        bytes: the rest is never read (PTB's own download reads a file whole first); all within
        ``within`` seconds. Errors as :meth:`do_request`'s; a status other than 200 is a
        :class:`NetworkError`."""
        session = self._session
        if session is None or session.closed:
            raise RuntimeError("This AiohttpRequest is not initialized!")
        data = bytearray()
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=within),
                                   allow_redirects=False) as response:
                if response.status != 200:
                    raise NetworkError(f"file download answered HTTP {response.status}")
                async for chunk in response.content.iter_chunked(64 * 1024):
                    data.extend(chunk)
                    if len(data) > limit:
                        return None
        except TimeoutError as exc:
            raise TimedOut from exc
        except aiohttp.ClientError as exc:
            raise NetworkError(f"aiohttp.{type(exc).__name__}") from exc
        return bytes(data)
