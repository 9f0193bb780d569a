"""The Lua sources of ``lua/``, loaded once as ``Script`` objects. Private to the store:
everything else calls them through ``actors.store.scripts.Scripts``.

Every script gets ``codes.lua`` first: the constants it shares with Python
(``actors.store.codes``), so a script says ``NONE`` or ``CODE_NOT_FOUND`` where the
decoder on this side reads the same name."""

from __future__ import annotations

from pathlib import Path

from runtime.redis_io import Script

_LUA_DIR = Path(__file__).parent / "lua"


def _read(name: str) -> str:
    return (_LUA_DIR / f"{name}.lua").read_text(encoding="utf-8")


def _script(name: str, *preludes: str) -> Script:
    """``name``'s source after ``codes.lua`` and the ``preludes`` (sources of ``lua/``, in
    order): Redis 7.0 scripts cannot import one another."""
    return Script(name, "".join(_read(n) for n in ("codes", *preludes, name)))


def _load(name: str, *, records: bool = False) -> Script:
    """``records=True``: a task script, which gets ``records.lua`` (how a task is stored)
    put before its own source."""
    return _script(name, "records") if records else _script(name)


def _load_labelled(name: str) -> Script:
    """A script that writes or deletes labels: ``records.lua`` and ``labels.lua`` first."""
    return _script(name, "records", "labels")


def _load_with(name: str, *preludes: str) -> Script:
    """A script with ``records.lua`` and these shared sources (``lua/<prelude>.lua``, in
    order) before its own: the functions one task change shares between the script for
    one task and the one for an operator's batch (``status.lua``, ``task_delete.lua``), and
    how a task's occurrences and attention entry are kept (``history.lua``)."""
    return _script(name, "records", *preludes)


def _load_flight(name: str) -> Script:
    """A script of fires in flight: ``records.lua`` and ``flight.lua`` before its source."""
    return _script(name, "records", "flight")


def records_prelude() -> str:
    """``records.lua`` after ``codes.lua`` (it reads records by the names defined there):
    how a task is stored, shared by every task script."""
    return _read("codes") + _read("records")


CREATE_TASKS = _script("create_tasks", "records", "labels", "history")
CLAIM_DUE = _load("claim_due", records=True)
READ_DEFINITIONS = _load("read_definitions")
DEFER_UNREADABLE = _load("defer_unreadable")
KEEP_META = _load("keep_meta")
COMMIT_FIRES = _load_with("commit_fires", "flight", "history")
RELEASE_PARTITION = _load("release_partition")
POLLER_MEMBERS = _load("poller_members")
SET_STATUS = _load_with("set_status", "flight", "status")
UPDATE_TASK = _script("update_task", "records", "labels", "flight")
DELETE_TASKS = _load_with("delete_tasks", "labels", "history", "task_delete")
MIGRATE_TASKS = _load("migrate_tasks")
ENQUEUE = _load("enqueue")
BEGIN_RUNS = _load("begin_runs")
ACK = _load("ack")
DEAD_LETTER = _load("dead_letter")
SCHEDULE_RETRIES = _load("schedule_retries", records=True)
CLAIM_RETRIES = _load("claim_retries", records=True)
COMMIT_RETRIES = _load("commit_retries")
RECORD_OUTCOMES = _load_with("record_outcomes", "history")
RECLAIM = _load("reclaim")
RENEW_LEASES = _load("renew_leases")
RELEASE = _load("release")
PRUNE_CONSUMERS = _load("prune_consumers")
TRIM_ACKED = _load("trim_acked")
REPLAY_DEAD = _load("replay_dead")
PURGE_QUEUE = _load("purge_queue")
OWN_NAME = _load("own_name")
DISOWN_NAME = _load("disown_name")
RECOVER = _load("recover")
COUNT_DELIVERY = _load("count_delivery")
OVERLAP = _load_with("overlap", "flight", "history")
END_FLIGHTS = _load_flight("end_flights")
CANCEL_FIRES = _load("cancel_fires")
CONFIRM_FLIGHTS = _load_flight("confirm_flights")
TRIGGER_TIME = _load("trigger_time")
BACKFILL = _script("backfill", "append_once")
ACKNOWLEDGE = _load_with("acknowledge", "history")
NODE_NUMBER = _load("node_number")
ACTION_BATCH = _load_with("action_batch", "labels", "history", "task_delete", "flight", "status")
ACTION_FIRES = _script("action_fires", "append_once")
ACTION_LEASE = _load("action_lease")
