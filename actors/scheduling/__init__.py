"""The roles that put fires into streams: the poller (due tasks to their type's stream)
and the retry dispatcher (due retries back to it), which share one claim loop
(claim, enqueue, commit; ``claim_loop``).

May import: ``actors.store``, ``actors.domain``, ``runtime``. Never ``execution`` (checked:
``lint-imports``).
"""
