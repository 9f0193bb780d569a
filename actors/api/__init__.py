"""The HTTP API actor and what it serves: routes (the one route table, from which the
OpenAPI document is generated), request bodies, problem details, request signatures, and
the operator views (``explain``: why a task is or is not running; ``queues``: backlog and
dead letters).

May import: ``actors.store``, ``actors.domain``, ``runtime``. Never the roles.
"""
