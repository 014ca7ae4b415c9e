"""Pure domain rules: no I/O, shared by workers and services."""
