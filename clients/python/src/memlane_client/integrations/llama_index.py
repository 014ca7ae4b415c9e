"""LlamaIndex over memlane (`pip install 'memlane-client[llama-index]'`): a retriever over recall's
ranked search, each node a record."""

from __future__ import annotations

import asyncio

from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from memlane_client.http import Found, MemlaneClient
from memlane_client.integrations._loop import LoopThread


def node(f: Found) -> NodeWithScore:
    r = f.record
    return NodeWithScore(node=TextNode(id_=r.id, text=r.summary if not r.content else f"{r.summary}\n{r.content}",
                                       metadata={"kind": r.kind, "version": r.version}), score=f.score)


class MemlaneRetriever(BaseRetriever):
    """`MemlaneRetriever(api_url, key, session=..., k=5)`: memory search as a LlamaIndex retriever."""

    def __init__(self, api_url: str, key: str, *, session: str | None = None, user: str | None = None,
                 k: int = 5) -> None:
        super().__init__()
        self.api_url, self.key, self.session, self.user, self.k = api_url, key, session, user, k
        self._loop: LoopThread | None = None

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        async with MemlaneClient(self.api_url, self.key, session=self.session, user=self.user) as c:
            found, _ = await c.search_memory(query_bundle.query_str, limit=self.k)
        return [node(f) for f in found]

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._aretrieve(query_bundle))
        if self._loop is None:
            self._loop = LoopThread()
        return self._loop.run(self._aretrieve(query_bundle))
