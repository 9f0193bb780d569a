"""The HTTP API: an actor of the node serving signed JSON endpoints (issue 5).

- ``problems``: errors as RFC 9457 problem details, and the one table mapping store errors
  to HTTP statuses;
- ``bodies``: request bodies and query parameters, validated with cattrs;
- ``routes``: the endpoints, each a thin call into ``actors.store``/``queues``/``explain``;
- ``openapi``: the OpenAPI document the app serves;
- ``server``: the API actor (hypercorn on trio).
"""
