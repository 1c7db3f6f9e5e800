"""A cell's Python environment: built with uv from torch and transformers versions (never from a cell), keyed
and cached by those versions, and the `harness env` command that lists and prunes the cache.

Runs in the `harness run` process on the host that runs the cell, before the cell's pytest starts."""
