"""Every Redis key Metronome uses, built in one place, with the hash tags that keep each
atomic operation inside one cluster slot.

Layout for namespace ``ns`` (the seed's names in brackets; see ARCHITECTURE.md):

- ``ns:meta``                     hash: partitions, buckets, layout       (new)
- ``ns:types``                    set: task types ever created            (new)
- ``ns:nodes``                    hash: process name -> presence JSON     (new)
- ``ns:pollers``                  zset: poller id -> alive until ms       (new: ownership)
- ``ns:nonce:<key_id>:<nonce>``   string with expiry: a used API nonce    [anti-replay nonces]
- ``{ns:P}:def:<B>``              hash: task_id -> definition record      [task:{id}, part 1]
- ``{ns:P}:state:<B>``            hash: task_id -> state record           [task:{id}, part 2]
- ``{ns:P}:run:<B>``              hash: task_id -> run record (once it ran) [task:{id}, part 3]
- ``{ns:P}:errors``               hash: task_id -> last error (failing tasks only)
- ``{ns:P}:schedule``             zset: task_id -> next fire ms           [schedule:zset]
- ``{ns:P}:poller``               hash: the partition's owner: poller, until, renewed,
                                  owed, owed_from, owed_version, inflight (claims not
                                  committed yet),
                                  writes (API writes to its tasks, counted), version
                                                                          (new: ownership)
- ``{ns:P}:type:<type>:<B>``      hash: task_id -> '' of one type         (index for list/clear)
- ``{ns:P}:labels``               hash: task_id -> labels as compact JSON (labelled tasks only)
- ``{ns:P}:label:<k>=<v>:<B>``    hash: task_id -> '' of one label pair   (index for list)
- ``{ns:P}:retry``                zset: schedule_id -> retry due ms       [retry:zset]
- ``{ns:P}:retry:<schedule_id>``  hash: retry context                     [retry:task:{id}]
- ``{ns:P}:trig:<task_id>``       string with expiry: the task's last manual trigger ms
- ``{ns:q:<type>}:queue``         stream + consumer group of one type     [queue:{type}]
- ``{ns:q:<type>}:dlq``           stream: dead letters of one type        [dlq:{type}]
- ``{ns:q:<type>}:enq:<sid>:<n>``  string with expiry: attempt n of fire sid enqueued
- ``{ns:q:<type>}:seen:<sid>:<n>`` string with expiry: attempt n of fire sid started
- ``{ns:P}:action:<action_id>``  hash with expiry: an operator's action's progress in the
                                  partition (``action_batch.lua``)
- ``{ns:actions}:action:<action_id>`` hash with expiry: an operator's action, its lease
- ``{ns:actions}:open``           zset: actions not done -> lease end ms
- ``{ns:q:<type>}:action:<action_id>`` hash with expiry: tasks an action's trigger
                                  appended (``action_fires.lua``)
- ``{ns:q:<type>}:backfilled:<id>`` hash with expiry: due_ms -> '' of the task's fires a
                                  backfill appended (``backfill.lua``)

``P`` is the task's partition, ``crc32(task_id) % partitions``; ``B`` its bucket,
``bucket_hash(task_id) % buckets`` (both counts fixed per namespace, in the meta key). A
task is not a key of its own: its two records are fields of bucket hashes that hold ~60
tasks each at a million tasks, small enough for Redis's compact listpack encoding, which
costs a fraction of a hash per task (``actors/store/records.py``, docs/PERFORMANCE.md).
All keys of a partition share
the tag ``{ns:P}``, so claim/commit/update scripts touch one slot; a type's queue and DLQ
share ``{ns:q:<type>}``, so moving a poison message to the DLQ is one script too.
Names inside keys are checked by ``runtime.config.check_name``: no braces or colons.
"""

from __future__ import annotations

import zlib

import attrs

from actors.domain.labels import label_key_problem, label_value_problem
from runtime.config import check_name

#: Bumped when the layout changes incompatibly; stored in the meta key.
LAYOUT_VERSION = 3
#: Older layouts ``metronome migrate`` converts to this one (``actors.store.migrate``).
MIGRATES_FROM = (1, 2)
#: The meta key's ``messages`` once fires go to the streams as compact messages
#: (``actors.store.messages``); absent in a namespace an older version made.
COMPACT_MESSAGES = 2


#: Buckets per partition of a new namespace (``[scheduler] buckets``), and the most allowed.
DEFAULT_BUCKETS = 1024
MAX_BUCKETS = 65536
#: Attempts of a backfilled time whose consumers' dedupe markers (``seen_prefix``,
#: ``[consumers.<type>] dedupe_window_s``) a backfill removes: a run of the time within
#: the window, retried up to this many times, does not make its backfilled copy a
#: duplicate. Past it (a type with ``max_attempts`` above it, retried within the window),
#: the copy's later attempts may be.
SEEN_ATTEMPTS = 16

#: The modulus of ``bucket_hash``: a prime below 2**32, so every step of the hash is exact
#: in a Lua number (a double) as in Python.
_BUCKET_PRIME = 4_294_967_291


def bucket_hash(task_id: str) -> int:
    """The hash that picks a task's bucket: the id's bytes as a big-endian number, modulo a
    prime (one C call here; consecutive ids land in consecutive buckets). Lua computes the
    same byte by byte (``actors/store/lua/records.lua``: a claim finds a task's records from its
    id alone); a test holds the two equal."""
    return bucket_hash_of_bytes(task_id.encode())


def bucket_hash_of_bytes(task_id: bytes) -> int:
    """``bucket_hash`` of an id as Redis returned it (no decode on the claim's hot path)."""
    return int.from_bytes(task_id, "big") % _BUCKET_PRIME


def nonce_prefix(namespace: str) -> str:
    """``Keys.nonce_prefix`` from the namespace alone: the API checks signatures before
    it has read the namespace's layout (Redis away when its node started)."""
    return f"{namespace}:nonce:"


@attrs.frozen
class Keys:
    namespace: str = attrs.field(validator=lambda _i, _a, v: check_name("namespace", v))
    partitions: int = attrs.field(validator=attrs.validators.ge(1))
    buckets: int = attrs.field(default=DEFAULT_BUCKETS, validator=attrs.validators.ge(1))
    compact_messages: bool = False
    """Whether fires are appended to the streams as compact messages (``messages`` = 2 in
    the meta key: ``actors.store.messages``); a namespace an older version made keeps the
    full form until ``metronome migrate`` says every node reads the compact one."""

    @property
    def meta(self) -> str:
        return f"{self.namespace}:meta"

    @property
    def types(self) -> str:
        return f"{self.namespace}:types"

    @property
    def nodes(self) -> str:
        """Live processes of the namespace's nodes (``actors.observability.presence``)."""
        return f"{self.namespace}:nodes"

    @property
    def pollers(self) -> str:
        """Live pollers of the namespace (``actors.scheduling.ownership``)."""
        return f"{self.namespace}:pollers"

    @property
    def nonce_prefix(self) -> str:
        """API nonces (``actors.api.signing``): prefix .. key_id:nonce, each with an expiry."""
        return nonce_prefix(self.namespace)

    @property
    def node_numbers(self) -> str:
        """The numbers node names go by in task histories (``node_number.lua``)."""
        return f"{self.namespace}:nodenums"

    def partition_of(self, task_id: str) -> int:
        return zlib.crc32(task_id.encode()) % self.partitions

    def tag(self, partition: int) -> str:
        return f"{{{self.namespace}:{partition}}}"

    def bucket_of(self, task_id: str) -> int:
        return bucket_hash(task_id) % self.buckets

    def definitions(self, partition: int, bucket: int) -> str:
        """Scripts build this from the tag (``records.lua``); the same names here."""
        return f"{self.tag(partition)}:def:{bucket}"

    def states(self, partition: int, bucket: int) -> str:
        return f"{self.tag(partition)}:state:{bucket}"

    def runs(self, partition: int, bucket: int) -> str:
        """Run records: what the consumers' outcomes wrote (``record_outcomes.lua``)."""
        return f"{self.tag(partition)}:run:{bucket}"

    def errors(self, partition: int) -> str:
        return f"{self.tag(partition)}:errors"

    def by_type(self, partition: int, task_type: str, bucket: int) -> str:
        return f"{self.tag(partition)}:type:{task_type}:{bucket}"

    def labels(self, partition: int) -> str:
        """Labels of the partition's labelled tasks: hash task_id -> compact JSON (a task
        without labels has no field). Scripts build this from the tag
        (``create_tasks.lua``, ``update_task.lua``, ``delete_tasks.lua``)."""
        return f"{self.tag(partition)}:labels"

    def by_label(self, partition: int, key: str, value: str, bucket: int) -> str:
        """The index of one label pair, bucketed like the type index: hash task_id -> ''."""
        problem = label_key_problem(key) or label_value_problem(value)
        if problem is not None:
            raise ValueError(f"label: {problem}")
        return f"{self.tag(partition)}:label:{key}={value}:{bucket}"

    def schedule(self, partition: int) -> str:
        return f"{self.tag(partition)}:schedule"

    def flights(self, partition: int) -> str:
        """The fires in flight of tasks with an overlap policy, what waits behind them and
        their dead streaks (``overlap.lua``, ``record_outcomes.lua``): hash task_id -> record."""
        return f"{self.tag(partition)}:flight"

    def parked(self, partition: int) -> str:
        """Tasks parked for their flight, each on a time counted already: hash task_id ->
        ms (``mark_parked`` in ``flight.lua``)."""
        return f"{self.tag(partition)}:parked"

    def not_run(self, partition: int) -> str:
        """Fires not run, per task: hash task_id -> 'count reason due_ms blocking_due_ms'
        (the last one, and how many in all; ``overlap.lua``, ``end_flights.lua``, and a
        stop's or update's dropped waiting fires: ``drop_waiting`` in ``flight.lua``)."""
        return f"{self.tag(partition)}:notrun"

    def notes(self, partition: int) -> str:
        """Operators' notes on paused or resumed tasks: hash task_id -> JSON."""
        return f"{self.tag(partition)}:notes"

    def history(self, partition: int) -> str:
        """Tasks' last occurrences: hash task_id -> ring (``actors.store.history``;
        scripts build this and the next three from the tag, ``history.lua``)."""
        return f"{self.tag(partition)}:history"

    def history_errors(self, partition: int) -> str:
        """The error lines of tasks' failed occurrences: hash task_id -> lines."""
        return f"{self.tag(partition)}:history:errors"

    def attention(self, partition: int) -> str:
        """Tasks whose latest occurrence needs an operator: hash task_id -> entry
        (``actors.store.ledger``)."""
        return f"{self.tag(partition)}:attention"

    def attention_counts(self, partition: int) -> str:
        """How many of the partition's tasks are on the attention list: hash
        'type reason' -> count."""
        return f"{self.tag(partition)}:attention:counts"

    def acks(self, partition: int) -> str:
        """Operators' acknowledgements of tasks taken off the attention list: hash
        task_id -> JSON (``acknowledge.lua``)."""
        return f"{self.tag(partition)}:acks"

    def partition_owner(self, partition: int) -> str:
        """Which poller serves the partition, until when (``claim_due.lua``)."""
        return f"{self.tag(partition)}:poller"

    def retry(self, partition: int) -> str:
        return f"{self.tag(partition)}:retry"

    def retry_context_prefix(self, partition: int) -> str:
        return f"{self.tag(partition)}:retry:"

    def queue(self, task_type: str) -> str:
        return f"{{{self.namespace}:q:{task_type}}}:queue"

    def dlq(self, task_type: str) -> str:
        return f"{{{self.namespace}:q:{task_type}}}:dlq"

    def enqueued_prefix(self, task_type: str) -> str:
        """Markers of fires enqueued recently (enqueue-time dedupe), in the queue's slot."""
        return f"{{{self.namespace}:q:{task_type}}}:enq:"

    def owner(self, task_type: str, consumer: str) -> str:
        """Who holds a consumer name of a type's group (``own_name.lua``)."""
        return f"{{{self.namespace}:q:{task_type}}}:owner:{consumer}"

    def poison_ends(self, task_type: str, consumer: str) -> str:
        """What the poison a consumer's claimer dead-lettered leaves to do in its tasks'
        partitions (``reclaim.lua``: hash of message id -> packed (now, task_id, due_ms,
        policy code, attempt)), until the claimer has done it: kept in Redis, so a reply
        lost or a claimer gone first never leaves a task's flight or history without it."""
        return f"{{{self.namespace}:q:{task_type}}}:poison_ends:{consumer}"

    def cancels(self, task_type: str) -> str:
        """Fires to cancel wherever they run (``cancel_other``): hash schedule_id -> ms."""
        return f"{{{self.namespace}:q:{task_type}}}:cancel"

    def trigger_time(self, task_id: str) -> str:
        """A task's last manual trigger time (``trigger_time.lua``), in its partition's
        slot: string ms, kept a minute."""
        return f"{self.tag(self.partition_of(task_id))}:trig:{task_id}"

    def backfilled(self, task_type: str, task_id: str) -> str:
        """The grid times of a task that backfills appended (``backfill.lua``): hash due_ms
        -> '', in the queue's slot so that marking and appending are one atomic step."""
        return f"{{{self.namespace}:q:{task_type}}}:backfilled:{task_id}"

    def action_progress(self, partition: int, action_id: str) -> str:
        """An operator's action's progress in one partition (``action_batch.lua``): the
        last task id done, counts, kept failures, done; in the partition's slot, so a batch
        and its mark are one script."""
        return f"{self.tag(partition)}:action:{action_id}"

    def action_record(self, action_id: str) -> str:
        """An operator's action: what it does, who asked, its state and lease
        (``action_lease.lua``)."""
        return f"{{{self.namespace}:actions}}:action:{action_id}"

    @property
    def actions_open(self) -> str:
        """Actions not done yet, by lease end: what the resumers look at."""
        return f"{{{self.namespace}:actions}}:open"

    def action_fired(self, task_type: str, action_id: str) -> str:
        """The tasks of a type an action's trigger appended (``action_fires.lua``), in the
        stream's slot so that marking and appending are one step."""
        return f"{{{self.namespace}:q:{task_type}}}:action:{action_id}"

    def seen_prefix(self, task_type: str) -> str:
        """Markers of fires started recently (consumer-side dedupe), in the queue's slot."""
        return f"{{{self.namespace}:q:{task_type}}}:seen:"


#: The consumer group every node's consumers of a type join.
GROUP = "metronome"
#: A group consumer idle this long (ms) with nothing pending is gone: live consumers read
#: every few seconds at most. Claimers remove such consumers; views leave them out.
CONSUMER_GONE_MS = 60_000


def schedule_id(task_id: str, due_ms: int) -> str:
    """The deterministic id of one fire: the same fire always has the same id."""
    return f"{task_id}:{due_ms}"
