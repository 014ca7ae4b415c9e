"""Which embedder the settings choose: the one place that knows both adapters."""

from __future__ import annotations

from projections.embedders.onnx import OnnxMiniLM
from projections.embedders.port import Embedder


def make_embedder(settings, cache_size: int = 20_000) -> Embedder:
    """The embedder the settings choose: `MEMLANE_EMBEDDINGS=openai` or the local default.

    `cache_size`: recent texts whose vectors are kept, for a process that embeds the same
    texts for several readers (the API: the review's queries and history folds). It is the
    API's only vector cache, so it is sized for a history backlog, whose repeated texts
    (greetings, tool boilerplate) recur thousands of turns apart."""
    if settings.embeddings == "openai":
        # Imported here: a process on the local model never loads the openai package for it.
        from projections.embedders.openai_api import OpenAIEmbedder

        return OpenAIEmbedder(
            settings.openai_base_url, settings.openai_api_key, settings.embedding_model, settings.embedding_dim,
            cache_size=cache_size,
        )
    if settings.embeddings != "local":
        raise ValueError(f"embeddings: {settings.embeddings!r} is not one of 'local', 'openai'")
    return OnnxMiniLM(threads=settings.embed_threads or None, cache_size=cache_size)
