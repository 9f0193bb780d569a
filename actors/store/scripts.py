"""The typed door to the Lua scripts: one method per script, keys built inside.

Each script's header (in ``lua/<name>.lua``) lists its KEYS, ARGV and reply; the methods
here are the only code that builds those lists or decodes those replies. Callers pass
typed values (partitions, task ids, messages) and get typed results (``actors.store.replies``)
or typed errors (``actors.store.codes``). Calls that cover several partitions or types are
pipelined in one round trip, one script call per partition or per chunk.

``Scripts`` is composed of one part per caller: the scheduling roles'
(``actors.store.scheduling_scripts``), the execution roles' for their fires
(``actors.store.execution_scripts``) and their upkeep (``actors.store.upkeep_scripts``), the
operators' (``actors.store.operator_scripts``) and their actions over selected tasks
(``actors.store.action_scripts``), over the flights' and the task
store's scripts (``actors.store.flights``, ``actors.store.task_scripts``).

The roles depend on ``Scripts`` alone, so a test can subclass it to fail at a chosen step
(``tests/test_poller.py`` fails a commit and checks that the fire still runs).
"""

from __future__ import annotations

from actors.store.action_scripts import ActionScripts
from actors.store.codes import NOT_ENQUEUED
from actors.store.execution_scripts import ExecutionScripts
from actors.store.operator_scripts import OperatorScripts, as_str
from actors.store.scheduling_scripts import ENQUEUE_CHUNK, SchedulingScripts
from actors.store.upkeep_scripts import TRIM_CALLS, TRIM_STEP

__all__ = [
    "ENQUEUE_CHUNK",
    "NOT_ENQUEUED",
    "TRIM_CALLS",
    "TRIM_STEP",
    "Scripts",
    "as_str",
]


class Scripts(SchedulingScripts, ExecutionScripts, OperatorScripts, ActionScripts):
    """Every Lua script of one namespace, as typed async methods (the task store's own
    scripts are in the base class, the flights' in ``FlightScripts``)."""
