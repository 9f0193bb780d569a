"""Example handlers, so a fresh node (deploy/node.toml) has a type it can run."""

from __future__ import annotations

from typing import Any

from metronome import HandlerContext


async def echo(ctx: HandlerContext) -> Any:
    """Logs the fire and returns its payload (which lands in the results log)."""
    ctx.log.info("echo", payload=ctx.payload, attempt=ctx.attempt)
    return ctx.payload


async def fail(ctx: HandlerContext) -> Any:
    """Always fails: its fires are retried, then dead-lettered (to try the DLQ tools)."""
    raise RuntimeError(f"example failure on attempt {ctx.attempt}")
