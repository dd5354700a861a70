"""Reading a request body with a size cap, for every route that takes one (the webhook and ``/v1/*``)."""

from __future__ import annotations

from starlette.requests import Request


async def read_body(request: Request, limit_bytes: int) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit_bytes``: by its Content-Length, or
    while it streams in (a chunked body has none, and reading it whole first let 400 MiB into memory)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit_bytes:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)
