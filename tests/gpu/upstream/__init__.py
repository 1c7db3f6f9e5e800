"""Upstream bugs: the known-bugs table and how a failure matches it, the verified releases, and the
reproducer `harness repro` writes."""
