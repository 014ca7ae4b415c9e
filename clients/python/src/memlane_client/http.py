"""The async client of memlane's HTTP API."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx
from pydantic import BaseModel

from memlane_client.records import Record
from memlane_client.trace_context import traceparent

# POSTs that only read: sent again to another replica when the first did not answer.
_READS = frozenset({"/v1/memory/search", "/v1/memory/search/batch", "/v1/recall", "/v1/history/search"})


class MemlaneError(Exception):
    def __init__(self, status: int, code: str, field: str | None, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.field, self.message = status, code, field, message


def _expected(version: int | None) -> dict[str, int]:
    """`expected_version` when the caller names the version it read (docs/features/trust.md)."""
    return {} if version is None else {"expected_version": version}


@dataclass
class Found:
    record: Record
    score: float | None


class MemlaneClient:
    """Async client of the HTTP API for one key (and optionally one session or turn, and the
    member, `user`, and channel a call speaks for)."""

    # What records are read as: a server may read them as its own model.
    record_type: type[Any] = Record

    def __init__(
        self,
        base_url: str | Sequence[str],
        key: str,
        *,
        session: str | None = None,
        preview: bool = False,
        turn_ref: str | None = None,
        turn: int | None = None,
        tenant: str | None = None,
        agent: str | None = None,
        user: str | None = None,
        channel: str | None = None,
        execution_id: str | None = None,
        invocation: int | None = None,
        agent_version: int | None = None,
        timeout: float = 40.0,
        failover_s: float | None = None,
    ) -> None:
        """`base_url`: one API, or several serve replicas of one deployment. With several, a
        call goes to the next replica when one is down or not caught up, for up to
        `failover_s` (10 s by default), and reads send back the log positions earlier answers
        gave (`X-Memlane-Position`), so what this client wrote or saw is never missing from
        another replica's answer."""
        self.urls = [u.rstrip("/") for u in ([base_url] if isinstance(base_url, str) else base_url)]
        if not self.urls:
            raise ValueError("base_url: name at least one API URL")
        self.failover_s = (10.0 if len(self.urls) > 1 else 0.0) if failover_s is None else failover_s
        self.at = 0  # the replica calls go to until it fails
        self.positions: dict[int, int] = {}  # event partition -> offset, the highest any answer gave
        headers = {"Authorization": f"Bearer {key}"}
        for name, value in (
            ("X-Session", session),
            ("X-Turn-Ref", turn_ref),
            ("X-Tenant", tenant),
            ("X-Agent", agent),
            ("X-User", user),
            ("X-Channel", channel),
            ("X-Execution-Id", execution_id),
        ):
            if value:
                headers[name] = value
        for name, number in (("X-Invocation", invocation), ("X-Agent-Version", agent_version)):
            if number is not None:
                headers[name] = str(number)
        if preview:
            headers["X-Preview"] = "true"
        if turn is not None:
            headers["X-Turn"] = str(turn)
        # base_url: the first replica, for callers that use `http` directly.
        self.http = httpx.AsyncClient(base_url=self.urls[0], headers=headers, timeout=timeout)

    async def __aenter__(self) -> MemlaneClient:
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _send(self, method: str, path: str, **kw: Any) -> httpx.Response:
        """One call, failing over between replicas: a replica that cannot be reached, or that
        answers 503, is left for the next. A request that may have reached a replica is sent
        again only when that is safe: a read, or a write that names its command id."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.failover_s
        again = method == "GET" or path in _READS or (isinstance(kw.get("json"), dict) and "command_id" in kw["json"])
        failed = httpx.TransportError if again else (httpx.ConnectError, httpx.ConnectTimeout)
        tried = 0
        if (parent := traceparent()) is not None:  # the request joins the caller's trace
            kw["headers"] = {**kw.get("headers", {}), "traceparent": parent}
        while True:
            if self.positions:
                kw["headers"] = {**kw.get("headers", {}), "X-Memlane-After": ",".join(
                    f"{p}:{o}" for p, o in sorted(self.positions.items()))}
            try:
                resp = await self.http.request(method, self.urls[self.at] + path, **kw)
            except failed:
                if loop.time() >= deadline:
                    raise
            else:
                if not (resp.status_code == 503 and again and loop.time() < deadline):
                    self._note(resp)
                    return resp
            self.at, tried = (self.at + 1) % len(self.urls), tried + 1
            if tried % len(self.urls) == 0:  # every replica failed once: give them a moment
                await asyncio.sleep(0.2)

    def _note(self, resp: httpx.Response) -> None:
        partition, sep, offset = resp.headers.get("X-Memlane-Position", "").partition(":")
        if sep and partition.isdigit() and offset.isdigit():
            self.positions[int(partition)] = max(self.positions.get(int(partition), 0), int(offset))

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._send(method, path, **kw)
        if resp.status_code >= 400:
            try:
                err = resp.json()["error"]
            except Exception:
                raise MemlaneError(resp.status_code, "HTTP_ERROR", None, resp.text) from None
            raise MemlaneError(resp.status_code, err["code"], err.get("field"), err["message"])
        return resp.json()

    async def health(self) -> dict[str, Any]:
        return await self._call("GET", "/health")

    async def whoami(self) -> dict[str, Any]:
        return await self._call("GET", "/v1/whoami")

    async def list_keys(self, tenant: str | None = None) -> list[dict[str, Any]]:
        return (await self._call("GET", "/v1/admin/keys", params={"tenant": tenant} if tenant else {}))["keys"]

    async def revoke_key(self, key_id: str, tenant: str | None = None) -> dict[str, Any]:
        params = {"tenant": tenant} if tenant else {}
        return (await self._call("DELETE", f"/v1/admin/keys/{key_id}", params=params))["revoked"]

    async def issue_key(self, tenant: str, agent: str | None, role: str = "agent", user: str | None = None) -> str:
        """A new key: `user` names a member key's member (role "member"; agent None: every agent)."""
        return (await self.issue_key_entry(tenant, agent, role, user))["key"]

    async def issue_key_entry(self, tenant: str, agent: str | None, role: str = "agent",
                              user: str | None = None) -> dict[str, Any]:
        """A new key with its public entry (id, tenant, agent, role, created, a member key's user)."""
        body = {"tenant": tenant, "agent": agent, "role": role, **({"user": user} if user is not None else {})}
        return await self._call("POST", "/v1/admin/keys", json=body)

    async def configure(self, config: BaseModel | dict[str, Any]) -> dict[str, Any]:
        body = config.model_dump(mode="json") if isinstance(config, BaseModel) else config
        return await self._call("PUT", "/v1/config", json=body)

    async def config(self) -> Any:
        """The agent's configuration, as JSON."""
        return await self._call("GET", "/v1/config")

    async def add_memory(self, summary: str, *, wait: bool = True, **fields: Any) -> dict[str, Any]:
        # A command id of its own makes the write safe to send again (the ledger applies an id once).
        fields.setdefault("command_id", str(uuid.uuid4()))
        return await self._call("POST", "/v1/memory", params={"wait": wait}, json={"summary": summary, **fields})

    async def search_memory(self, query: str | None = None, **filters: Any) -> tuple[list[Found], str | None]:
        body = {"query": query, **{k: v for k, v in filters.items() if v is not None}}
        data = await self._call("POST", "/v1/memory/search", json=body)
        found = [Found(self.record_type.model_validate({k: v for k, v in r.items() if k not in ("score", "trust")}), r.get("score"))
                 for r in data["records"]]
        return found, data["next_cursor"]

    async def recall(self, conversation: str, text: str, run_id: str | None = None,
                     application: str | None = None, as_of: str | None = None) -> dict[str, Any]:
        """`as_of`: what recall would have shown at a past time or log position."""
        body = {"conversation": conversation, "text": text} | ({"run_id": run_id} if run_id else {}) | (
            {"application": application} if application else {}) | ({"as_of": as_of} if as_of else {}) | {
            "request_id": uuid.uuid4().hex}
        return await self._call("POST", "/v1/recall", json=body)  # a retry sends the same request_id

    async def search_history(self, query: str | None = None, **filters: Any) -> dict[str, Any]:
        body = {"query": query, **{k: v for k, v in filters.items() if v is not None}}
        return await self._call("POST", "/v1/history/search", json=body)

    async def message_history(self, conversation: str | None = None, cursor: str | None = None,
                              limit: int | None = None) -> dict[str, Any]:
        """One conversation (a session; default the caller's) oldest first, a page at a time."""
        params = {k: v for k, v in {"conversation": conversation, "cursor": cursor, "limit": limit}.items()
                  if v is not None}
        return await self._call("GET", "/v1/history/messages", params=params)

    async def read_memory(self, rid: str, version: int | None = None) -> Record:
        params = {"version": version} if version else {}
        return self.record_type.model_validate(await self._call("GET", f"/v1/memory/{rid}", params=params))

    async def history(self, rid: str) -> list[Record]:
        """Every version, newest first (the API pages them: this reads every page)."""
        out: list[Record] = []
        params: dict[str, Any] = {"first": 100}
        while True:
            data = await self._call("GET", f"/v1/memory/{rid}/history", params=params)
            out += [self.record_type.model_validate(v) for v in data["versions"]]
            if not data.get("next_cursor"):
                return out
            params["after"] = data["next_cursor"]

    async def delete_memory(self, rid: str, expected_version: int | None = None) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/memory/{rid}", params=_expected(expected_version))

    async def edit_memory(self, rid: str, **fields: Any) -> dict[str, Any]:
        """Operator keys, and member keys for their own facts: new text makes a successor record."""
        return await self._call("PATCH", f"/v1/memory/{rid}", json=fields)

    async def pin(self, rid: str, expected_version: int | None = None) -> dict[str, Any]:
        return await self._call("POST", f"/v1/memory/{rid}/pin", params=_expected(expected_version))

    async def unpin(self, rid: str, expected_version: int | None = None) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/memory/{rid}/pin", params=_expected(expected_version))

    async def report_outcome(self, rid: str, success: bool, expected_version: int | None = None) -> dict[str, Any]:
        return await self._call("POST", f"/v1/memory/{rid}/outcome",
                                json={"success": success, **_expected(expected_version)})

    async def blocks(self, application: str | None = None) -> list[dict[str, str]]:
        params = {"application": application} if application else {}
        return (await self._call("GET", "/v1/blocks", params=params))["blocks"]

    async def curate_block(self, label: str, action: str, line: str | None = None, old: str | None = None,
                           scope: str = "agent", application: str | None = None) -> dict[str, Any]:
        body = {"action": action, **({"line": line} if line is not None else {}), **({"old": old} if old is not None else {})}
        params = {"scope": scope, **({"application": application} if application else {})}
        return await self._call("POST", f"/v1/blocks/{label}", params=params, json=body)

    async def read_profile(self, user: str) -> dict[str, Any]:
        """A member's profile on the agent (docs/features/profiles.md): text and version."""
        return await self._call("GET", f"/v1/profiles/{user}")

    async def write_profile(self, user: str, text: str, expected_version: int | None = None,
                            wait: bool = True) -> dict[str, Any]:
        body = {"text": text, **_expected(expected_version)}
        return await self._call("PUT", f"/v1/profiles/{user}", params={"wait": wait}, json=body)

    async def delete_profile(self, user: str, expected_version: int | None = None) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/profiles/{user}", params=_expected(expected_version))

    # Tenant and platform memory (docs/features/tenant-platform-memory.md): operator keys.
    async def conventions(self, status: str | None = None) -> list[dict[str, Any]]:
        params = {"status": status} if status else {}
        return (await self._call("GET", "/v1/tenant/conventions", params=params))["conventions"]

    async def decide_convention(self, convention_id: str, approve: bool) -> dict[str, Any]:
        action = "approve" if approve else "reject"
        return await self._call("POST", f"/v1/tenant/conventions/{convention_id}/{action}")

    async def floors(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/v1/tenant/floors"))["floors"]

    async def set_floor(self, floor_id: str, text: str) -> dict[str, Any]:
        return await self._call("PUT", f"/v1/tenant/floors/{floor_id}", json={"text": text})

    async def remove_floor(self, floor_id: str) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/tenant/floors/{floor_id}")

    async def platform_entries(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/v1/platform/entries"))["entries"]

    async def set_platform_entry(self, entry_id: str, kind: str, text: str) -> dict[str, Any]:
        return await self._call("PUT", f"/v1/platform/entries/{entry_id}", json={"kind": kind, "text": text})

    async def remove_platform_entry(self, entry_id: str) -> dict[str, Any]:
        return await self._call("DELETE", f"/v1/platform/entries/{entry_id}")

    async def list_memory(self, first: int = 20, after: str | None = None, sort: str = "DESC",
                          as_of: str | None = None) -> dict[str, Any]:
        params: dict[str, Any] = {"first": first, "sort": sort}
        if after:
            params["after"] = after
        if as_of:
            params["as_of"] = as_of
        return await self._call("GET", "/v1/memory", params=params)

    async def consent(self) -> dict[str, Any]:
        """The member's consent on the agent (a member key's own, or X-User's) and whether they get memory now."""
        return await self._call("GET", "/v1/consent")

    async def grant_consent(self) -> dict[str, Any]:
        """Member keys: the member grants the agent consent to keep and use memory about them."""
        return await self._call("POST", "/v1/consent")

    async def withdraw_consent(self) -> dict[str, Any]:
        """The member's key, or an operator key naming the member: stops writes and recall, deletes nothing."""
        return await self._call("DELETE", "/v1/consent")

    async def subjects(self) -> dict[str, Any]:
        """Operator keys: the agent's members, with their fact counts and consent (never a fact)."""
        return await self._call("GET", "/v1/subjects")

    async def erase_subject(self, user: str) -> dict[str, Any]:
        """Operator keys: erases the member's memory on the agent; answers how many facts."""
        return await self._call("DELETE", f"/v1/subjects/{user}")

    async def remove_agent(self) -> dict[str, Any]:
        """Operator keys: the agent's memory is never served again."""
        return await self._call("DELETE", "/v1/agent")

    async def remove_user(self, user: str) -> dict[str, Any]:
        """Operator keys: the user is deleted: no agent of the tenant serves their memory again,
        their member keys are revoked (`revoked_keys`) and their memory is wiped."""
        return await self._call("DELETE", f"/v1/users/{user}")

    async def remove_member(self, user: str) -> dict[str, Any]:
        """Operator keys: the member leaves the tenant: not served and their keys revoked, but their
        facts and consent are kept until `restore_user`."""
        return await self._call("DELETE", f"/v1/members/{user}")

    async def restore_user(self, user: str) -> dict[str, Any]:
        """Operator keys: a removed member may be issued keys and grant consent again."""
        return await self._call("POST", f"/v1/users/{user}/restore")

    async def restore_tenant(self) -> dict[str, Any]:
        """The deployment's operator key: keys may be issued in the removed tenant again."""
        return await self._call("POST", "/v1/tenant/restore")


    # ------------------------------------------------------------------ notes (docs/features/notes.md)

    async def save_note(self, note_id: str, topic: str, summary: str, source_messages: list[str | dict[str, str]],
                        expected_revision: int = 0) -> dict[str, Any]:
        """memory_save: `expected_revision` 0 makes the note, else its current revision revises it.
        A source is a message id of this session, or {"conversation", "id"} of another."""
        body = {"topic": topic, "summary": summary, "source_messages": source_messages,
                "expected_revision": expected_revision}
        return await self._call("PUT", f"/v1/notes/{note_id}", json=body)

    async def read_note(self, note_id: str) -> dict[str, Any]:
        """memory_read: the note with its source messages (`hidden` when one can no longer be seen)."""
        return await self._call("GET", f"/v1/notes/{note_id}")

    async def forget_note(self, note_id: str, expected_revision: int | None = None) -> dict[str, Any]:
        """memory_forget: the note goes; its messages stay."""
        params = {} if expected_revision is None else {"expected_revision": expected_revision}
        return await self._call("DELETE", f"/v1/notes/{note_id}", params=params)

    async def search_notes(self, query: str | None = None, limit: int | None = None,
                           cursor: str | None = None) -> dict[str, Any]:
        """memory_search with kind "notes": by topic and summary; `next_cursor` pages on."""
        params = {k: v for k, v in (("query", query), ("limit", limit), ("cursor", cursor)) if v is not None}
        return await self._call("GET", "/v1/notes", params=params)
