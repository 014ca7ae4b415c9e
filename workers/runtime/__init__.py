"""The runtime every worker and follower shares: the runner, Kafka I/O, dead letters,
heartbeats, probes, metrics and the data keys topic."""
