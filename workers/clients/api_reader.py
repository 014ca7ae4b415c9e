"""What workers read through the HTTP API, as an operator: agents' configurations and
memory searches. Workers never open the index themselves (an Edge shard belongs to the API)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from typing import Any

import aiohttp
from pydantic_core import from_json, to_json

from events.config import AgentConfig
from events.record import MemoryRecord
from events.rules import extraction_review as review
from events.turns import TurnCommitted
from workers.runtime.batching import MicroBatcher
from workers.runtime.runner import Transient


class ApiReader:
    """The agent's configuration and its most similar memories, as the agent's operator.

    Similar-memory searches of concurrent reviews go out together (`MicroBatcher`), each
    with its own agent, session and user, to `/v1/memory/search/batch`."""

    def __init__(self, settings) -> None:
        self.ttl = settings.config_cache_s
        self.base_url = settings.api_url.rstrip("/")
        # aiohttp, not httpx: a search batch's answer is tens of kB, and httpx parsed it in
        # pure Python (h11), ~5% of the worker's CPU; aiohttp's parser is C.
        self.http = aiohttp.ClientSession(
            headers={"Authorization": f"Bearer {settings.operator_key}"},
            timeout=aiohttp.ClientTimeout(total=30.0),
            connector=aiohttp.TCPConnector(limit=64),
        )
        self.configs: dict[str, tuple[float, AgentConfig]] = {}
        self.fetching: dict[str, asyncio.Future] = {}
        # Small batches, 2 out at a time: a poll's reviews all ask at once, and the API
        # answers concurrent batches interleaved, so a few large batches made every review
        # wait for the last answer; small ones let the first reviews call the model sooner.
        self.searches: MicroBatcher[dict[str, Any], list[MemoryRecord]] = MicroBatcher(
            self._search_batch, max_items=32, max_in_flight=2
        )
        self.requests: Counter[str] = Counter()  # search requests and searches, for the batch summary

    async def close(self) -> None:
        await self.http.close()

    async def _call(self, method: str, path: str, headers: dict[str, str], content: bytes | None = None) -> Any:
        try:
            async with self.http.request(method, self.base_url + path, headers=headers, data=content) as resp:
                body = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as e:
            raise Transient(f"API unreachable at {self.base_url}: {type(e).__name__}") from e
        if resp.status >= 500:
            raise Transient(f"API answered {resp.status} for {path}")
        if resp.status >= 400:
            raise ApiRefused(f"API answered {resp.status} for {path}: {body[:300].decode(errors='replace')}")
        return from_json(body)

    async def config(self, tenant: str, agent: str) -> AgentConfig:
        # Cached briefly: a configuration change reaches extraction within `config_cache_s`.
        key = f"{tenant}/{agent}"
        hit = self.configs.get(key)
        if hit and time.monotonic() - hit[0] < self.ttl:
            return hit[1]
        # One request per agent at a time: when the entry expires, every review of that agent
        # in flight (hundreds in a backlog) misses at once, and as many requests queued on
        # the connection pool cost the worker more CPU than the reviews themselves.
        fetch = self.fetching.get(key)
        if fetch is None:
            fetch = self.fetching[key] = asyncio.ensure_future(self._fetch_config(key, tenant, agent))
        return await asyncio.shield(fetch)

    async def _fetch_config(self, key: str, tenant: str, agent: str) -> AgentConfig:
        try:
            cfg = AgentConfig.model_validate(await self._call("GET", "/v1/config", {"X-Tenant": tenant, "X-Agent": agent}))
        finally:
            self.fetching.pop(key, None)
        self.configs[key] = (time.monotonic(), cfg)
        if len(self.configs) > 10_000:
            self.configs.pop(next(iter(self.configs)))
        return cfg

    async def similar(self, turn: TurnCommitted, queries: list[str]) -> list[MemoryRecord]:
        ctx: dict[str, Any] = {"tenant": turn.tenant, "agent": turn.agent, "session": turn.session,
                               "preview": turn.preview}
        # Searched as the turn's member: user-scope facts are that member's alone, so a
        # review never shows one member's facts to another's. Left out when unset, as a
        # search's headers are.
        if turn.user is not None:
            ctx["user"] = turn.user
        if turn.channel is not None:
            ctx["channel"] = turn.channel
        found = await asyncio.gather(
            *(self.searches.submit({**ctx, "query": q[:4000], "limit": review.SIMILAR_PER_MESSAGE}) for q in queries)
        )
        # Interleave by rank, so each message's best match gets a handle before anyone's third.
        out: list[MemoryRecord] = []
        for rank in range(review.SIMILAR_PER_MESSAGE):
            out.extend(f[rank] for f in found if len(f) > rank)
        return out

    async def _search_batch(self, items: list[dict[str, Any]]) -> list[list[MemoryRecord] | BaseException]:
        # Written and read by pydantic-core's JSON, not the stdlib's (docs/decisions/0008-extraction-search-json.md).
        self.requests["search_requests"] += 1
        self.requests["searches"] += len(items)
        data = await self._call(
            "POST", "/v1/memory/search/batch", {"Content-Type": "application/json"}, content=to_json({"searches": items, "retrieved": False})
        )
        out: list[list[MemoryRecord] | BaseException] = []
        for res in data["results"]:
            if "error" in res:
                out.append(SearchFailed(f"search answered {res.get('status')}: {res['error'].get('message')}"))
            else:
                out.append([MemoryRecord.model_validate({k: v for k, v in r.items() if k not in ("score", "trust")})
                            for r in res["records"]])
        return out


class ApiRefused(Exception):
    """The API answered 4xx: asking again cannot fix it (not transient)."""


class SearchFailed(Exception):
    """The API refused one search of a batch (not a transient failure)."""
