"""Kill -9, broker and Redis outages, rebalances, replica failover, the supervisor: the tier that breaks things on purpose."""
