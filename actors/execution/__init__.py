"""The roles that run fires: per task type, a consumer (reading, running, completing and
lease renewal, each its own module; the completion decision is a pure function) and a
claimer (taking over messages of dead consumers), plus handler resolution and the
results log on disk.

May import: ``actors.store``, ``actors.domain``, ``runtime``. Never ``scheduling`` (checked:
``lint-imports``).
"""
