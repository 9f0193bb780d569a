"""The scheduler's roles (poller, consumers, claimer, retry dispatcher, API) and its Redis model.

Every actor imports the Redis model from one place: ``actors.keys`` builds every key,
``actors.scripts`` wraps every Lua script, ``actors.codec`` encodes tasks and messages.
``actors.app`` is the node application that ``python -m runtime`` runs.
"""
