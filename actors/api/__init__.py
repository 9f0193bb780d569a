"""The HTTP API actor and what it serves: routes (the one route table, from which the
OpenAPI document is generated), request bodies, problem details, request signatures, and
the operator views (``explain``: why a task is or is not running; ``queues``: backlog and
dead letters).

What it may import is checked, not described: the contracts in ``pyproject.toml``
(``[tool.importlinter]``, run by ``lint-imports``).
"""
