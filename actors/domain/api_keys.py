"""An API key: who may sign requests to a node's API, and whether only to read.

It lives below both its users so neither imports the other for it: the node's config
(``actors.config``: ``[[api.keys]]`` resolves to keys) and the API's signing
(``actors.api.signing``: the server verifies with them, the clients sign with one).
Pure data; the secret never shows in a repr.
"""

from __future__ import annotations

import re

import attrs

#: What a key id may be: the ``X-Metronome-Key`` header and ``[[api.keys]] id``.
KEY_ID_PATTERN = re.compile(r"[A-Za-z0-9_.-]{1,64}")


@attrs.frozen
class ApiKey:
    key_id: str
    secret: bytes = attrs.field(repr=False)
    read_only: bool = False
