"""Reading a request body with a size cap and a time limit, for every route that takes one (the webhook and
``/v1/*``)."""

from __future__ import annotations

import anyio
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request

# The whole body must have arrived this long after the handler starts reading it. The Kubernetes API server gives
# a webhook at most 30 s (`timeoutSeconds`, 1-30; default 10: admissionregistration.k8s.io/v1 ValidatingWebhook)
# and sends the review in one write; a body still trickling in after that is waited for by no one. Without a
# limit a client sending one byte a second held its request (and its task) open for ever, and a SIGTERM then
# waited on it past the pod's grace period.
BODY_TIMEOUT_SECONDS = 30.0


async def read_body(request: Request, limit_bytes: int, timeout_seconds: float | None = None) -> bytes | None:
    """The request body, or None as soon as it is known to exceed ``limit_bytes``: by its Content-Length, or
    while it streams in (a chunked body has none, and reading it whole first let 400 MiB into memory).

    A body not complete within ``timeout_seconds`` (default :data:`BODY_TIMEOUT_SECONDS`) raises an
    ``HTTPException`` 408 whose answer closes the connection (``Connection: close``), so the rest of a slow body
    is not read on into the next request."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isascii() and declared.isdigit() and int(declared) > limit_bytes:
        return None
    limit_seconds = BODY_TIMEOUT_SECONDS if timeout_seconds is None else timeout_seconds
    chunks: list[bytes] = []
    size = 0
    with anyio.move_on_after(limit_seconds) as deadline:
        try:
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit_bytes:
                    return None
                chunks.append(chunk)
        except ClientDisconnect:  # the client went away mid-body: its request, not a server error (logged as 500)
            raise HTTPException(400, f"client disconnected after {size} bytes of the body",
                                headers={"Connection": "close"}) from None
    if deadline.cancelled_caught:
        raise HTTPException(408, f"request body not complete within {limit_seconds:g} s ({size} bytes arrived)",
                            headers={"Connection": "close"})
    return b"".join(chunks)
