"""A blocking client: `MemlaneClient`'s calls, each run to its end on a loop of the client's own."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from memlane_client.http import MemlaneClient


class SyncMemlaneClient:
    """`SyncMemlaneClient(url, key, session=...)`; `with` it, or `close()` it. Every method of
    `MemlaneClient` is here without `await`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._loop = asyncio.new_event_loop()
        self._client = self._loop.run_until_complete(self._make(*args, **kwargs))

    @staticmethod
    async def _make(*args: Any, **kwargs: Any) -> MemlaneClient:
        return MemlaneClient(*args, **kwargs)  # made in its loop: its connection pool belongs to it

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._client, name)
        if not asyncio.iscoroutinefunction(method):
            return method

        @functools.wraps(method)
        def call(*args: Any, **kwargs: Any) -> Any:
            return self._loop.run_until_complete(method(*args, **kwargs))

        return call

    def __enter__(self) -> SyncMemlaneClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        if not self._loop.is_closed():
            self._loop.run_until_complete(self._client.aclose())
            self._loop.close()
