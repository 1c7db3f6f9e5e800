"""`harness run`: plan the cells, prepare each one's environment and folder, execute it through its engine,
record what the run was, and render the result in the terminal.

Runs in the `harness run` process (a workflow job's step, or a person's shell)."""
