"""`harness history append`: read results folders and append them to the history database as one night."""

from __future__ import annotations

from typing import Any

from harness.history.append import append_night, check_night_id, night_date
from harness.history.night_reader import read_night
from harness.history.renames import read_renames
from harness.history.store import open_history


def command(args: Any) -> int:
    night = check_night_id(args.night)
    date = night_date(args.date)
    renames = read_renames(args.renamed) if args.renamed else ()
    cells = read_night(args.results)  # before the database is touched: bad folders leave it as it was
    connection = open_history(args.db, create=True)
    try:
        appended = append_night(connection, night, date, cells, renames)
    finally:
        connection.close()
    if appended.renamed:
        print(f"history {args.db}: {appended.renamed} earlier test names moved to their renamed files "
              f"({args.renamed})")
    print(f"history {args.db}: night {appended.night}: {appended.tests} tests; {appended.nights_kept} nights kept")
    return 0
