"""Observability: Prometheus metrics counted from the lifecycle events (``metrics``), gauges
read from Redis at scrape time (``redis_gauges``), the ``/metrics`` endpoint and its own
listener (``endpoint``), and the web dashboard's static files (``dashboard/``).

The roles do not know it exists: they log events, and the metrics count them. What it
may import, and who may import it, is checked: the contracts in ``pyproject.toml``
(``[tool.importlinter]``, run by ``lint-imports``).
"""
