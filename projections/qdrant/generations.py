"""Where the memory index's generations live: the port the projections, the rebuild and the
API read through, and its two adapters.

A generation is a set of shards of agents; readers use the current one, and a rebuild fills the
next beside it and switches. Embedded (`EdgeGenerations`): `<root>/CURRENT` names the current
generation and `<root>/memory-g<N>/` holds its shard count (`SHARDS`), the Edge shards `s<k>/`
and their checkpoints. With a Qdrant server or qdrant-client's local mode (`ServerGenerations`)
each shard is a collection, the shard aliases name the current generation, and a generation's
shard count is how many collections it has; the checkpoints stay under `<root>/server`.

Both are values (a rebuild's shard processes get them pickled) built by the composition root.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from projections.qdrant.index import EdgeIndex

if TYPE_CHECKING:
    from projections.qdrant.client_index import ClientIndex, Collections


class IndexGenerations(Protocol):
    @property
    def root(self) -> Path:
        """This host's directory of the index (the data directory's `qdrant/`)."""
        ...

    def current(self) -> int:
        """The generation readers use (1 in a new deployment)."""
        ...

    def begin(self, generation: int) -> None:
        """Makes `generation` current if none is yet: a new deployment's first generation."""
        ...

    def count(self, generation: int) -> int:
        """The generation's shard count, made with `shards` if it has no shards yet."""
        ...

    def open(self, generation: int, shard: int) -> EdgeIndex | ClientIndex:
        ...

    def prepare(self, generation: int) -> int:
        """An empty generation (a failed rebuild's leftovers gone); returns its shard count."""
        ...

    def switch(self, old: int, generation: int) -> None:
        """Readers move from `old` to `generation`. The API may still read `old` until it
        swaps, so only generations older than it go."""
        ...


@dataclass(frozen=True)
class EdgeGenerations:
    """Embedded Edge shards under `root` (the data directory's `qdrant/`)."""

    root: Path
    shards: int

    def current(self) -> int:
        try:
            return int((self.root / "CURRENT").read_text())
        except FileNotFoundError:
            return 1

    def begin(self, generation: int) -> None:
        """Nothing to do: a missing `CURRENT` reads as generation 1."""

    def path(self, generation: int | None = None) -> Path:
        return self.root / f"memory-g{self.current() if generation is None else generation}"

    def paths(self, generation: int | None = None) -> list[Path]:
        """The shard directories of a generation. A new generation takes the configured count
        and keeps it; one made before sharding (itself an Edge shard) is one shard."""
        root = self.path(generation)
        if (root / "edge_config.json").exists():
            return [root]
        count = root / "SHARDS"
        if not count.exists():
            root.mkdir(parents=True, exist_ok=True)
            tmp = root / "SHARDS.tmp"
            tmp.write_text(str(self.shards))
            tmp.replace(count)
        return [root / f"s{k}" for k in range(int(count.read_text()))]

    def count(self, generation: int) -> int:
        return len(self.paths(generation))

    def open(self, generation: int, shard: int) -> EdgeIndex:
        return EdgeIndex(self.paths(generation)[shard])

    def prepare(self, generation: int) -> int:
        shutil.rmtree(self.path(generation), ignore_errors=True)
        return self.count(generation)

    def switch(self, old: int, generation: int) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / "CURRENT.tmp"
        tmp.write_text(str(generation))
        tmp.replace(self.root / "CURRENT")
        for stale in range(1, old):
            shutil.rmtree(self.path(stale), ignore_errors=True)
            self.path(stale).with_name(f"memory-g{stale}.checkpoint.json").unlink(missing_ok=True)


@dataclass(frozen=True)
class ServerGenerations:
    """Collections on a Qdrant server at `url`, or in qdrant-client's local mode under
    `local_root`; the projections' checkpoints under `root / "server"`."""

    root: Path
    shards: int
    url: str | None
    prefix: str
    local_root: Path | None = None
    api_key: str | None = None
    dim: int = 384

    def collections(self) -> Collections:
        # Imported here: qdrant-client takes seconds to import, which an Edge deployment never needs.
        from projections.qdrant.client_index import Collections

        return Collections(self.url, self.prefix, self.root / "server", local_root=self.local_root,
                           api_key=self.api_key, dim=self.dim)

    def current(self) -> int:
        return self.collections().live() or 1

    def begin(self, generation: int) -> None:
        cols = self.collections()
        if cols.live() is None:
            cols.switch(generation)  # a new deployment: its first generation gets the aliases

    def count(self, generation: int) -> int:
        return self.collections().ensure(generation, self.shards)

    def open(self, generation: int, shard: int) -> ClientIndex:
        return self.collections().open(generation, shard)

    def prepare(self, generation: int) -> int:
        self.collections().drop(generation)
        return self.count(generation)

    def switch(self, old: int, generation: int) -> None:
        cols = self.collections()
        cols.switch(generation)
        for stale in sorted(g for g in cols.generations() if g < old):
            cols.drop(stale)
