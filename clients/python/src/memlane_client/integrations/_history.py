"""A session's history as the adapters read and write it: messages read from the API, turns and
deletions published to the turns topic (the `kafka` extra)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from memlane_client.http import MemlaneClient


class SessionLog:
    def __init__(self, api_url: str | list[str], key: str, *, tenant: str, agent: str, session: str,
                 kafka_bootstrap: str, topic_prefix: str = "", user: str | None = None) -> None:
        self.api_url, self.key, self.tenant, self.agent = api_url, key, tenant, agent
        self.session, self.user, self.bootstrap, self.prefix = session, user, kafka_bootstrap, topic_prefix
        self.turn = 0

    async def messages(self) -> list[dict[str, Any]]:
        """The session's messages, oldest first: id, role, text (without the turn's heading), turn."""
        out: list[dict[str, Any]] = []
        async with MemlaneClient(self.api_url, self.key, session=self.session, user=self.user) as c:
            cursor: str | None = None
            while True:
                page = await c.message_history(cursor=cursor)
                for e in page["events"]:
                    text = e["text"].split("\n", 1)[1] if "\n" in e["text"] else e["text"]
                    out.append({"id": e["id"], "role": e["role"], "text": text, "turn": e["turn"]})
                    self.turn = max(self.turn, e["turn"])
                if not (cursor := page.get("next_cursor")):
                    return out

    async def publish_turn(self, messages: list[tuple[str, str, str]]) -> None:
        """One turn of (id, role, text) messages; extraction reviews it as any platform's turn."""
        self.turn += 1
        await self._publish({
            "type": "TurnCommitted", "event_id": str(uuid.uuid4()), "tenant": self.tenant, "agent": self.agent,
            "session": self.session, "user": self.user, "turn": self.turn, "execution_id": f"x-{self.session}",
            "occurred_at": datetime.now(UTC).isoformat(),
            "messages": [{"id": mid, "role": role, "content": text} for mid, role, text in messages]})

    async def delete(self, message_id: str) -> None:
        await self._publish({"type": "MessageDeleted", "event_id": str(uuid.uuid4()), "tenant": self.tenant,
                             "agent": self.agent, "session": self.session, "message_id": message_id,
                             "occurred_at": datetime.now(UTC).isoformat()})

    async def _publish(self, event: dict[str, Any]) -> None:
        from memlane_client.publisher import TurnPublisher

        async with TurnPublisher(self.bootstrap, self.prefix) as pub:
            await pub.publish(event)
