"""The stream side, by role: `runtime/` (the consume-process-produce runner, Kafka I/O, dead
letters, heartbeats, probes, metrics, data keys), `processors/` (what `memlane worker NAME`
runs, each with its helpers), `followers/` (what folds the log inside the API process),
`jobs/` (rebuild, replay, sweep, the optimise policy) and `clients/` (the model and the API,
as processors call them)."""
