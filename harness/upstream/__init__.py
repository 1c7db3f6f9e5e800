"""The suite's record of upstream bugs, as commands: `harness known-bugs verify` keeps each known-bugs entry's
newest release seen up to date from a run's results (verify), and `harness repro TEST_ID` writes a standalone
script that reproduces one case's failure for an upstream issue (repro). Runs in the user's `harness` process."""
