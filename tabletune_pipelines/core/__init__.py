"""Pure method library: numpy and the stdlib only, no I/O (DESIGN §2)."""
