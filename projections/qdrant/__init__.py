"""The vector index adapters: Qdrant Edge shards and a Qdrant server behind one port, the
session history index, and the ranking both share."""
