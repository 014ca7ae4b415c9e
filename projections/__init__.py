"""The read side: builders that fold memory events into Redis and Qdrant, and queries."""
