"""The Redis adapters: the connection port and cluster helpers, the record view (its reads, its
writes through one fold table, generations and purges) and the narrow views beside it (notes,
profiles, session memory, shared memory, session history, activity, API keys)."""
