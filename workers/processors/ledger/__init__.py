"""The memory ledger: the single writer per agent, with its snapshots and erasures."""
