-- Version 1: one row per night, per test (cell and test id) and per test's night, and each rank's peak memory.
-- Numbers that were not recorded or are not finite are NULL (the reader's Labelled values never come here).
CREATE TABLE nights (
    id INTEGER PRIMARY KEY,
    night TEXT NOT NULL UNIQUE,  -- the nightly's run id: appending it again replaces its rows
    night_date TEXT NOT NULL     -- ISO 8601, UTC; nights are ordered by it, then by id
);

CREATE TABLE tests (
    id INTEGER PRIMARY KEY,
    cell TEXT NOT NULL,
    test TEXT NOT NULL,          -- pytest's node id
    UNIQUE (cell, test)
);

CREATE TABLE results (
    night INTEGER NOT NULL REFERENCES nights (id),
    test INTEGER NOT NULL REFERENCES tests (id),
    outcome TEXT NOT NULL,
    time_s REAL,
    peak_mib REAL,               -- the largest over ranks
    error_over_bound REAL,       -- the largest of the case's errors over their bounds
    PRIMARY KEY (night, test)
) WITHOUT ROWID;

CREATE TABLE rank_peaks (
    night INTEGER NOT NULL REFERENCES nights (id),
    test INTEGER NOT NULL REFERENCES tests (id),
    rank INTEGER NOT NULL,
    peak_mib REAL NOT NULL,
    PRIMARY KEY (night, test, rank)
) WITHOUT ROWID;
