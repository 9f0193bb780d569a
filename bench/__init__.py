"""Benchmarks: repeatable commands that print one JSON line of figures.

``python -m bench --help`` lists the modes. Each starts its own Redis server on a free
loopback port (``--save "" --appendonly no``, temp dir) unless given ``--redis-url``.
"""
