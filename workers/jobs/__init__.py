"""Jobs run on demand or on a schedule: rebuild and replay from the log, the expiry sweep, and
the policy that says when an index wants optimising."""
