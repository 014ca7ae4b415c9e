"""The extraction worker: reviews committed turns and proposes memory commands."""
