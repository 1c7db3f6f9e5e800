"""What to run: a matrix file's schema and its expansion into cells, the runners a cell may go to, the
package index's releases (floating versions, pins) and the refusal of persistent runners for PR cells.

Pure data and lookups, run in the process that plans (`harness matrix`, the first step of `harness run`, the
workflow's plan job). Knows nothing of environments, engines or results."""
