"""Stream processors. Each runs as its own process: `memlane worker <name>`."""
