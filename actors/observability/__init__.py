"""Observability: Prometheus metrics counted from the lifecycle events (``metrics``), gauges
read from Redis at scrape time (``redis_gauges``), the ``/metrics`` endpoint and its own
listener (``endpoint``), and the web dashboard's static files (``dashboard/``).

May import ``store``, ``domain`` and ``runtime``; nothing imports it but ``api`` and
``app``. The roles do not know it exists: they log events, and the metrics count them.
"""
