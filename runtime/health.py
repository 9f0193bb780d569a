"""Which actors of this node are running, for readiness checks (``/readyz``).

The supervisors keep it: an actor is *up* once it has started, *down* from a crash until its
restart succeeds, or from the moment it is stopped. A child that exits for good (temporary,
or transient after a normal exit) is forgotten: it was meant to end. One ``Health`` per
process, shared by every ``ActorContext`` of its tree.

A node that runs parts of itself in child processes (``runtime.process``) sends each child
what is down in the main process (its own actors, and each child process as one actor),
so a child's ``/readyz`` reports on the whole node, not only on itself. Each child reports
back what is down in it, and whether its tree has started yet: until it has, and while
any of its actors is down, the main process is not ready either.
"""

from __future__ import annotations

import attrs
import trio_util


@attrs.define
class Health:
    _down: dict[str, str] = attrs.field(factory=dict)
    _up: set[str] = attrs.field(factory=set)
    _elsewhere: dict[str, str] = attrs.field(factory=dict)
    """Down in the node's main process, as its last report said (child processes only)."""
    _reported: dict[str, dict[str, str]] = attrs.field(factory=dict)
    """Down in each child process, as its last report said (main process only), by the
    path of the actor that runs it."""
    restarts: dict[str, int] = attrs.field(factory=dict)
    """Restarts of each actor path since the process started (what a dashboard shows)."""
    changes: trio_util.AsyncValue[int] = attrs.field(factory=lambda: trio_util.AsyncValue(0))
    """Counts changes to this process's record and its children's reports: wait on it to
    report them."""

    def mark_up(self, path: str) -> None:
        self._down.pop(path, None)
        self._up.add(path)
        self.changes.value += 1

    def mark_down(self, path: str, reason: str) -> None:
        self._up.discard(path)
        self._down[path] = reason
        self.changes.value += 1

    def forget(self, path: str) -> None:
        """``path`` and every actor under it ended on purpose (a temporary supervisor
        dropped: its children's marks go with it, and a child process's reports)."""
        under = f"{path}/"
        self._up = {p for p in self._up if p != path and not p.startswith(under)}
        self._down = {p: r for p, r in self._down.items() if p != path and not p.startswith(under)}
        self._reported = {
            s: d for s, d in self._reported.items() if s != path and not s.startswith(under)
        }
        self.changes.value += 1

    def note_restart(self, path: str) -> None:
        self.restarts[path] = self.restarts.get(path, 0) + 1

    def set_elsewhere(self, down: dict[str, str]) -> None:
        """What the node's main process reported down (replaces the previous report)."""
        self._elsewhere = dict(down)

    def report(self, source: str, down: dict[str, str]) -> None:
        """What the child process that ``source`` runs reported down (replaces its previous
        report; ``{}`` once it is gone)."""
        if down:
            self._reported[source] = dict(down)
        else:
            self._reported.pop(source, None)
        self.changes.value += 1  # for the other children (runtime.process._report_health)

    def down(self, *, local_only: bool = False) -> dict[str, str]:
        """Actors that should be running and are not, with why (``crashed``, ``stopped``,
        ``starting``); with the main process's and the child processes' reports unless
        ``local_only``."""
        if local_only:
            return dict(self._down)
        merged = dict(self._elsewhere)
        for down in self._reported.values():
            merged.update(down)
        merged.update(self._down)
        return merged

    def up(self) -> list[str]:
        return sorted(self._up)
