"""A disk reserve at our ``sessions.reserve.Reserve`` seam, for disks the tests fake.

:class:`RoomOnRelease` stands for the reserve file on a full disk: its first ``release`` gives
the disk room (``give_room``, e.g. a :class:`tests.fakes.disk.FaultyDisk`'s ``recover``) and
returns True, as deleting the file does; later ones return False. Without ``give_room`` it
holds nothing (a reserve that could not be made), and ``release`` always returns False.
"""

from __future__ import annotations

from collections.abc import Callable


class RoomOnRelease:
    """See the module docstring."""

    def __init__(self, give_room: Callable[[], None] | None) -> None:
        self._give_room = give_room
        self.held = give_room is not None
        self.releases = 0

    @property
    def wanted(self) -> bool:
        return False  # room given back stays given back here

    def ensure(self) -> bool:
        return self.held

    def release(self) -> bool:
        if not self.held or self._give_room is None:
            return False
        self.held = False
        self.releases += 1
        self._give_room()
        return True
