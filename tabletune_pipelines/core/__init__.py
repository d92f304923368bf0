"""Pure method library: numpy and the stdlib only, no I/O (the method: docs/method.md)."""
