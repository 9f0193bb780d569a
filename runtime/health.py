"""Which actors of this node are running, for readiness checks (``/readyz``).

The supervisors keep it: an actor is *up* once it has started, *down* from a crash until its
restart succeeds, or from the moment it is stopped. A child that exits for good (temporary,
or transient after a normal exit) is forgotten: it was meant to end. One ``Health`` per node,
shared by every ``ActorContext`` of the tree.
"""

from __future__ import annotations

import attrs


@attrs.define
class Health:
    _down: dict[str, str] = attrs.field(factory=dict)
    _up: set[str] = attrs.field(factory=set)

    def mark_up(self, path: str) -> None:
        self._down.pop(path, None)
        self._up.add(path)

    def mark_down(self, path: str, reason: str) -> None:
        self._up.discard(path)
        self._down[path] = reason

    def forget(self, path: str) -> None:
        self._up.discard(path)
        self._down.pop(path, None)

    def down(self) -> dict[str, str]:
        """Actors that should be running and are not, with why (``crashed``, ``stopped``)."""
        return dict(self._down)

    def up(self) -> list[str]:
        return sorted(self._up)
