"""`harness run`: a pipeline of stages, one module each, each handing the next a frozen value.

plan.py     the command's arguments and this machine  -> Plan: the selected cells, the results and env folders
prepare.py  one cell of the plan                      -> Prepared: its folder, env.json begun, its environment
                                                         (preflight, env build) and the engine's Launch
execute.py  Prepared                                  -> Executed: its engine (harness.engines) ran pytest,
                                                         this machine's GPUs sampled
record.py   Executed                                  -> CellOutcome: env.json and memory.json written
render.py   the CellOutcomes (a dry run: the Plan)    -> the terminal
command.py  the command: plans, then walks each cell down prepare, execute, record; renders; its exit status.

Runs in the `harness run` process (a workflow job's step, or a person's shell)."""
