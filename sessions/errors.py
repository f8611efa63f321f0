"""Errors raised by the ``sessions`` package.

One tree, so callers can catch at the level they care about::

    SessionError
    ├── InvalidNameError        a session id or tenant that is not a safe name
    ├── SessionNotFoundError    no such session for that tenant
    ├── SessionExistsError      create() with an id that is already taken
    ├── SessionLockedError      another process holds the session's writer lock
    ├── SessionWriteError       an append failed (entries kept for later, or refused); the log
    │                           still ends on a whole line
    ├── StaleWriterError        a writer whose lease/fence has been superseded tried to append
    ├── SessionReadError        a log that cannot be read as a session (replay's documented error)
    │   ├── EmptySessionError   no bytes, or only a torn header
    │   ├── CorruptHeaderError  line 1 is not a session header
    │   ├── NotARegularFileError  a directory, FIFO, device or symlink where a log should be
    │   └── BlobMissingError    a message refers to attachment bytes the blob store lacks
    │       └── BlobCorruptError  ...or holds damaged: they do not hash to their name
    └── BlobWriteError          attachment bytes could not be stored

Replay never raises anything outside ``SessionReadError`` for bad input: a corrupt line in the
middle of a file is reported as a :class:`Problem` with its line number, not raised.
"""

from __future__ import annotations


class SessionError(Exception):
    """Base of every error the sessions package raises on purpose."""


class InvalidNameError(SessionError, ValueError):
    """A session id or tenant failed validation; it is never turned into a path."""


class SessionNotFoundError(SessionError, LookupError):
    """The session does not exist (for that tenant)."""


class SessionExistsError(SessionError):
    """A session with that id already exists."""


class SessionLockedError(SessionError):
    """Another process is the writer of this session."""


class SessionWriteError(SessionError, OSError):
    """An append did not reach the log. The log is left ending on a whole line.

    ``kind`` is a short machine-friendly cause (``ENOSPC``, ``EACCES``, ``EIO``, ...) that is
    safe to log: it never contains entry contents. ``accepted`` says whether the writer took
    the entries anyway (kept, with their ``seq``, to be written ahead of the next append) or
    refused them (nothing of them will ever reach the log); see
    :class:`sessions.store.SessionWriter`.
    """

    def __init__(self, session_id: str, kind: str, detail: str = "", *,
                 accepted: bool = False) -> None:
        suffix = f": {detail}" if detail else ""
        super().__init__(f"session {session_id}: write failed ({kind}){suffix}")
        self.session_id = session_id
        self.kind = kind
        self.accepted = accepted


class StaleWriterError(SessionWriteError):
    """The writer's fencing token is older than the session's: another worker owns it now."""

    def __init__(self, session_id: str, token: int, current: int) -> None:
        super().__init__(session_id, "STALE_FENCE", f"token {token} < current {current}")
        self.token = token
        self.current = current


class SessionReadError(SessionError):
    """The bytes are not a readable session log. ``line`` is 1-based when known."""

    def __init__(self, message: str, line: int | None = None) -> None:
        super().__init__(f"line {line}: {message}" if line is not None else message)
        self.line = line


class EmptySessionError(SessionReadError):
    """The file holds no session header at all."""


class CorruptHeaderError(SessionReadError):
    """Line 1 is present but is not a valid ``session`` header."""


class NotARegularFileError(SessionReadError):
    """What should be a log is a directory, FIFO, socket, device or symlink (never opened for
    reading beyond a non-blocking ``open``), or starts with an absurdly long line."""


class BlobMissingError(SessionReadError, LookupError):
    """A message refers to a blob (attachment bytes) that the blob store does not hold.

    ``digest`` is the full sha256; ``label`` says which attachment (name, type, size). Replay
    raises it for the call that cannot be rebuilt (``call`` set), never a body without it.
    """

    _WHAT = "blob sha256 {digest} is not in the blob store ({label})"

    def __init__(self, digest: str, label: str, *, call: int | None = None,
                 line: int | None = None) -> None:
        what = self._WHAT.format(digest=digest, label=label)
        if call is not None:
            what = f"call {call} cannot be rebuilt: {what}"
        super().__init__(what, line=line)
        self.digest = digest
        self.label = label
        self.call = call


class BlobCorruptError(BlobMissingError):
    """The bytes a blob store holds under a hash do not hash to it (a damaged file or row): the
    read is refused, never served as the blob. ``actual`` is what they hash to."""

    _WHAT = "blob sha256 {digest} is damaged in the blob store ({label})"

    def __init__(self, digest: str, actual: str) -> None:
        super().__init__(digest, f"its stored bytes hash to {actual}; refused")
        self.actual = actual


class BlobWriteError(SessionError, OSError):
    """Attachment bytes did not reach the blob store; nothing half-written is left under the
    blob's name. ``kind`` is short and safe to log (an errno name or SQLSTATE)."""

    def __init__(self, kind: str, detail: str = "") -> None:
        suffix = f": {detail}" if detail else ""
        super().__init__(f"blob write failed ({kind}){suffix}")
        self.kind = kind
