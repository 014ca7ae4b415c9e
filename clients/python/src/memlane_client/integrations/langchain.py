"""LangChain over memlane (`pip install 'memlane-client[langchain]'`): a retriever over memory
search, and a chat message history that publishes each exchange as a turn, so extraction runs on it.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from langchain_core.callbacks import AsyncCallbackManagerForRetrieverRun, CallbackManagerForRetrieverRun
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.retrievers import BaseRetriever
from pydantic import ConfigDict

from memlane_client.http import Found, MemlaneClient
from memlane_client.integrations._history import SessionLog
from memlane_client.integrations._loop import LoopThread

ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def document(f: Found) -> Document:
    r = f.record
    return Document(page_content=r.summary if not r.content else f"{r.summary}\n{r.content}", id=r.id,
                    metadata={"id": r.id, "kind": r.kind, "score": f.score, "version": r.version,
                              "scope": str(getattr(r.scope, "value", r.scope)), "labels": dict(r.labels)})


class MemlaneRetriever(BaseRetriever):
    """Memory search as a retriever: `MemlaneRetriever(api_url=..., key=..., session=..., k=5)`.
    Each document is a record (its summary and content), with its id, kind and score."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    api_url: str
    key: str
    session: str | None = None
    user: str | None = None
    k: int = 5
    mode: str | None = None
    _loop: LoopThread | None = None

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
                                       ) -> list[Document]:
        async with MemlaneClient(self.api_url, self.key, session=self.session, user=self.user) as c:
            found, _ = await c.search_memory(query, limit=self.k, mode=self.mode)
        return [document(f) for f in found]

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.run(self._aget_relevant_documents(query, run_manager=run_manager))  # type: ignore[arg-type]


class MemlaneChatMessageHistory(BaseChatMessageHistory):
    """A session's messages: added ones are published as a turn (the `kafka` extra), read ones come
    from session history (`GET /v1/history/messages`, the agent's `history` configured)."""

    def __init__(self, api_url: str, key: str, *, tenant: str, agent: str, session: str, kafka_bootstrap: str,
                 topic_prefix: str = "", user: str | None = None) -> None:
        self.log = SessionLog(api_url, key, tenant=tenant, agent=agent, session=session,
                              kafka_bootstrap=kafka_bootstrap, topic_prefix=topic_prefix, user=user)
        self._loop = LoopThread()

    async def aget_messages(self) -> list[BaseMessage]:
        kinds = {"assistant": AIMessage, "system": SystemMessage}
        return [kinds.get(m["role"], HumanMessage)(content=m["text"], id=m["id"]) for m in await self.log.messages()]

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return self._loop.run(self.aget_messages())

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self.log.publish_turn([(m.id or str(uuid.uuid4()), ROLES.get(m.type, "user"),
                                      m.content if isinstance(m.content, str) else str(m.content))
                                     for m in messages if not isinstance(m, ToolMessage)])

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self._loop.run(self.aadd_messages(messages))

    async def aclear(self) -> None:
        """Deletes the session's messages from history (a `MessageDeleted` each)."""
        for m in await self.log.messages():
            await self.log.delete(m["id"])

    def clear(self) -> None:
        self._loop.run(self.aclear())
