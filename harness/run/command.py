"""`harness run`: run the suite for each selected cell and leave its results folder.

The command plans once (plan.py), prepares the results folder (an earlier run's cells kept aside: earlier.py),
then walks each cell down the stages (the cells of a pack, runners.yaml `pack: true`, at once: each a harness run
of its own, packed.py): prepare (its folder, env.json begun, its environment) -> execute (its engine runs pytest)
-> record (env.json, memory.json); then renders the cells in the terminal (render.py). A cell always leaves
``results/<cell-id>/`` with ``env.json`` saying how it ended, whatever went wrong (environment, busy GPU,
crash, timeout), and one cell's failure never stops the next.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from harness import errors
from harness.cell import preflight
from harness.contract import STATUS_NOT_RUN, STATUS_PASSED
from harness.engines import Interrupted, interruptible
from harness.plan.cells import Cell
from harness.run import earlier, execute, packed, plan, prepare, record, render
from harness.run.plan import Host
from harness.run.record import CellOutcome

EXIT_NOT_RUN = errors.EXIT_NOT_RUN  # no cell failed or errored but some ran nothing distributed (status not_run)


def command(args) -> int:
    planned = plan.plan(args)
    if args.dry_run:
        render.print_plan(planned)
        return 0
    kept = prepare.prepare_run(planned, f"--results {args.results}", keep_others=not args.in_pack)
    outcomes: list[CellOutcome] = []
    try:
        # Stopped before any cell has a folder: the earlier run goes back where it was (a second signal is ignored
        # meanwhile, so putting_back sits inside interruptible).
        with interruptible(), earlier.putting_back(kept, [cell.id for cell in planned.cells]), \
                prepare.harness_import_path() as import_path:
            for cells in packed.rounds(planned):
                if len(cells) > 1:  # runners.yaml pack: each a harness run of its own, at once
                    outcomes += packed.run_pack(cells, planned, matrix_argument=args.matrix or planned.matrix.reference,
                                                force=args.force, log=render.progress)
                    continue
                outcomes.append(run_cell(cells[0], host=planned.host, results_root=planned.results_root,
                                         env_dir=planned.env_dir, pytest_args=list(planned.pytest_args),
                                         log=render.progress, project=planned.matrix.root,
                                         matrix_reference=planned.matrix.reference, import_path=import_path,
                                         prepare_environment=preflight.checking_pins(preflight.prepare_environment),
                                         pack_tests=planned.pack_tests))
    except Interrupted as interrupted:
        print(f"harness: {interrupted}; the cell's folder says so", file=sys.stderr, flush=True)
        return errors.EXIT_SIGNAL + interrupted.signum
    if not args.in_pack:  # the run that started the pack shows every cell's row
        render.print_outcomes(outcomes, planned.results_root, kept=kept.folder)
    return exit_status([outcome.status for outcome in outcomes])


def run_cell(cell: Cell, *, host: Host, results_root: Path, env_dir: Path, pytest_args: list[str],
             log: Callable[[str], None], project: Path, matrix_reference: str, import_path: Path | None = None,
             prepare_environment: Callable = preflight.prepare_environment, pack_tests: bool = False) -> CellOutcome:
    """One cell down the stages; its folder is written whatever happens on the way, and an interruption or a
    failure of harness is raised again once it is. `prepare_environment(cell, env_dir, log)` gives the cell
    its interpreter; bisect swaps in one that installs a package built from a commit on top of the cell's
    environment."""
    prepared = prepare.prepare_cell(cell, host=host, results_root=results_root, env_dir=env_dir,
                                    pytest_args=pytest_args, log=log, project=project,
                                    matrix_reference=matrix_reference, import_path=import_path,
                                    prepare_environment=prepare_environment, pack_tests=pack_tests)
    return record.record(execute.execute(prepared), log)


def exit_status(statuses: list[str]) -> int:
    """1 when a cell failed or errored; EXIT_NOT_RUN when none did but one ran nothing distributed; else 0."""
    if any(status not in (STATUS_PASSED, STATUS_NOT_RUN) for status in statuses):
        return errors.EXIT_RED
    return EXIT_NOT_RUN if STATUS_NOT_RUN in statuses else 0


