"""The stream processors `memlane worker NAME` runs (and the companions that share a
worker's process), each with its helpers beside it."""
