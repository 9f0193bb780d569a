"""Reading what a client still sends of a body its request was answered without.

The API refuses some requests before reading their bodies (a declared length over
``[api] max_body_bytes``, signature headers that cannot pass: ``actors.api.routes``), and
any endpoint may answer without reading all of one. A server that closes the connection
with the body still arriving makes the kernel reset it: the client, still sending (most
clients send a whole body before they read an answer), sees its upload cut off, or left
hanging until its timeout, instead of the answer that says what was wrong.
``ReadUnreadBody`` sends such an answer whole but for its end, reads the rest of the body
and drops it (nothing is kept), then ends the answer, after which the server may close or
reuse the connection. The read is bounded in time and in bytes (twice ``max_body_bytes``:
a body declared a little over the limit gets its 413 whole).
"""

from __future__ import annotations

import trio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Longest the rest of a body is read before its answer ends; past it the connection is
#: closed as it is (a client that slow gets the reset).
UNREAD_BODY_S = 10.0


class ReadUnreadBody:
    """ASGI middleware: an HTTP answer that ``app`` ends before it has read the whole request
    body is sent, all its bytes, then the rest of the body is read and dropped (at most
    ``limit`` bytes, within ``UNREAD_BODY_S``), then the answer is ended."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        ended = False

        async def tracked() -> Message:
            nonlocal ended
            message = await receive()
            ended = message["type"] != "http.request" or not message.get("more_body", False)
            return message

        async def read_rest_before_the_end(message: Message) -> None:
            if ended or message["type"] != "http.response.body" or message.get("more_body"):
                await send(message)
                return
            await send({**message, "more_body": True})  # the whole answer, but its end
            read = 0
            with trio.move_on_after(UNREAD_BODY_S):
                while not ended and read <= self.limit:
                    read += len((await tracked()).get("body", b""))
            await send({"type": "http.response.body", "body": b"", "more_body": False})

        await self.app(scope, tracked, read_rest_before_the_end)
