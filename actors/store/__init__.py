"""The Redis model and the one typed door to it.

Owns every key (``keys``), how a task is stored (``records``), the stream message format
(``messages``), the Lua scripts (``lua/``) and their Python faces (``scripts``: typed
arguments in, typed results or typed errors out, keys built inside), the task store
(``tasks``) and layout migrations (``migrate``). Nothing outside this package builds
script arguments, decodes a script reply, or touches the redis-py client.

May import: ``actors.domain`` and ``runtime``.
"""
