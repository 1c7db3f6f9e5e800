"""`harness bisect`: the search over releases or commits for the first bad one, the probes that run a cell's
selection on each candidate, and the command around them.

Runs in the `harness bisect` process on a host that can run the cell; each probe is a `harness run` of its own
environment."""
