"""Cancel the work of a request whose client hung up (non-stream requests and stream set-up).

Starlette notices a disconnect only while it streams a response; a non-stream request to a
replica can take a minute of generation before the first byte. While inside
:class:`CancelOnDisconnect`, a watcher task waits for the ASGI ``http.disconnect`` message and
cancels the request's task, which closes the upstream connection (so vLLM aborts the
generation) and runs every ``finally`` that releases in-flight counts.
"""

from __future__ import annotations

import asyncio
from types import TracebackType

from starlette.types import Receive

from router.errors import APIError


class ClientGone(APIError):
    """499 (nginx's "client closed request"): the client disconnected before the answer."""

    status = 499
    type = "client_closed_request"


class CancelOnDisconnect:
    """``async with CancelOnDisconnect(receive): ...`` raises ClientGone if the client leaves."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._fired = False
        self._watcher: asyncio.Task[None] | None = None

    async def __aenter__(self) -> CancelOnDisconnect:
        task = asyncio.current_task()
        assert task is not None

        async def watch() -> None:
            while (await self._receive())["type"] != "http.disconnect":
                pass
            self._fired = True
            task.cancel()

        self._watcher = asyncio.create_task(watch())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._watcher is not None
        self._watcher.cancel()
        if self._fired and exc_type is asyncio.CancelledError:
            current = asyncio.current_task()
            assert current is not None
            current.uncancel()
            raise ClientGone("client closed the connection before the answer", code="client_gone")
