"""The scheduler: its roles as supervised trio actors, and the Redis model they share.

The tree is the architecture (ARCHITECTURE.md draws the same picture):

- ``domain/``     what a task is: model, schedules, names, typed errors. Pure; imports only
  ``runtime.config`` helpers.
- ``store/``      the Redis model and the one typed door to it: keys, records, stream
  messages, every Lua script behind a Python function (``store.scripts``), the task store,
  migrations. The only part of ``actors`` that builds script arguments or decodes replies.
- ``scheduling/`` the roles that put fires into streams: poller, retry dispatcher, and the
  claim loop they share.
- ``execution/``  the roles that run fires: consumer (reading, running, completing, leases),
  claimer, handlers, results log.
- ``api/``        the HTTP API actor, request signing, and the operator views it serves
  (explain, queues).
- ``admin/``      the ``metronome`` CLI and the signing Python client.

At the top: ``app.py`` (builds a node's supervision tree from its config: the one place
that decides which actors run and with which settings), ``config.py`` (the scheduler's
``node.toml`` sections) and ``examples.py`` (the example handler of the shipped config).

Code outside the project imports the public names from the top-level ``metronome``
package, never from here: everything in ``actors`` is internal. (``handlers``,
``client``, ``model`` and ``schedules`` here are deprecated aliases of those names.)

Imports point down the list above and never up: ``scheduling`` and ``execution`` do not
import each other, ``api`` does not import the roles, and nothing in ``actors`` imports
``app``. ``runtime`` never imports ``actors``. ``lint-imports`` checks these rules: the
contracts in ``pyproject.toml`` (``[tool.importlinter]``).
"""
