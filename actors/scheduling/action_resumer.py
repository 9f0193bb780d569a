"""The action resumer: finishes operators' actions over selected tasks whose applying node
died or whose request went away (``actors.store.actions``).

Every node runs one (``[actions] resumer``). Every ``[actions] resume_interval_s`` it
reads the actions not done (``{ns:actions}:open``, by lease end); one whose lease ran out,
or whose holder is a process of this host that has exited, is taken (``action_lease.lua``:
one taker wins) and applied from its partitions' marks (``apply_action``), renewing the
lease as it goes. The marks make this safe whoever applied what before: no task is
changed twice, none skipped. One action at a time; an outage is waited out (the apply is
repeated from the marks). An action whose record cannot be read (another program's, or
a version's this one does not read) is said once in an ``action_unreadable`` error line
and passed over (read again at each pass, resumed once it reads): it would fail every
try, and a crash at each would stop the resumer.
"""

from __future__ import annotations

import attrs
import trio

from actors.store.actions import open_actions, read_action, take_lease
from actors.store.apply_actions import ActionSettings, LeaseLost, apply_action
from actors.store.records import RecordError
from actors.store.tasks import TaskStore
from runtime.actor import ActorContext, TaskStatus
from runtime.liveness import holder_is_gone, owner_value


@attrs.frozen
class ResumerSettings:
    interval_s: float = 2.0
    actions: ActionSettings = attrs.field(factory=ActionSettings)


class ActionResumer:
    def __init__(self, store: TaskStore, settings: ResumerSettings) -> None:
        self.store = store
        self.settings = settings
        self._unreadable: set[str] = set()
        """Actions whose record this resumer found it cannot read: said once, then passed
        over (left as they are, open, for an operator to mend or delete) until a pass
        reads them whole."""

    async def run(self, ctx: ActorContext, *, task_status: TaskStatus) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.settings.interval_s)
            await self.store.client.ride_out(lambda: self.resume_one(ctx), ctx.name)

    async def resume_one(self, ctx: ActorContext) -> str | None:
        """Take and finish the first action left unfinished, if any; its id."""
        now = await self.store.client.time_ms()
        lease_ms = self.settings.actions.lease_ms
        for action_id, holder, until in await open_actions(self.store):
            if action_id in self._unreadable and not await self._mended(action_id):
                continue
            gone = holder if holder and holder_is_gone(holder, this_process_is_gone=False) else ""
            if until > now and not gone:
                continue
            mine = owner_value()
            if not await take_lease(self.store, action_id, mine, lease_ms, gone):
                continue
            ctx.log.info("action_resumed", action_id=action_id, holder=holder or None)
            try:
                await apply_action(self.store, action_id, mine, self.settings.actions)
            except LeaseLost:
                ctx.log.info("action_taken_over", action_id=action_id)
            except RecordError as exc:  # its record: one broken action stops no other
                self._unreadable.add(action_id)
                ctx.log.error("action_unreadable", action_id=action_id, error=str(exc))
                continue
            return action_id
        return None

    async def _mended(self, action_id: str) -> bool:
        """Whether an action found unreadable reads now (mended, or deleted: taking it
        then drops it from the open set): read again at each pass, before its lease is
        taken, so a broken one costs reads, never a write."""
        try:
            await read_action(self.store, action_id)
        except RecordError:
            return False
        self._unreadable.discard(action_id)
        return True
