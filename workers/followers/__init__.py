"""What folds the log inside each API process: the memory index and its reconciler, session
history's index, the activity view, API keys and web sessions."""
