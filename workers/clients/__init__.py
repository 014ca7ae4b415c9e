"""How processors call out: the chat model, and the memlane API as an operator."""
