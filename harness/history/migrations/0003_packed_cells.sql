-- Version 3: a night's tests packed per cell (harness.history.rows): a row per test and night cost some 40 bytes
-- in SQLite, 578 MiB for 30 nights of 200,000 tests. Cells and test names are interned; each column of the cell's
-- tests is one compressed blob (harness.history.packing), in the order of its name list, which is stored once
-- for all the nights that ran the same tests in the same order. The rows of version 2
-- (results, rank_peaks, losses, tests) are repacked into these by harness.history.repack, which then drops them.
CREATE TABLE cells (
    id INTEGER PRIMARY KEY,
    cell TEXT NOT NULL UNIQUE
);

CREATE TABLE names (
    id INTEGER PRIMARY KEY,
    test TEXT NOT NULL UNIQUE    -- pytest's node id
);

CREATE TABLE name_lists (
    id INTEGER PRIMARY KEY,
    names BLOB NOT NULL UNIQUE   -- uint32 ids into names, one per test of a packed row
);

CREATE TABLE packed (
    night INTEGER NOT NULL REFERENCES nights (id),
    cell INTEGER NOT NULL REFERENCES cells (id),
    tests INTEGER NOT NULL,      -- how many tests each blob holds
    name_list INTEGER NOT NULL REFERENCES name_lists (id),
    outcomes BLOB NOT NULL,      -- uint32 codes (rows.OUTCOMES)
    time_s BLOB NOT NULL,        -- float32, +inf where not recorded
    peak_mib BLOB NOT NULL,      -- the largest over ranks
    error_over_bound BLOB NOT NULL,
    rank_peaks BLOB NOT NULL,    -- per test: its ranks' peaks
    ranks BLOB NOT NULL,         -- uint32: the rank of each of those peaks, in their order
    losses BLOB NOT NULL,        -- per test: the loss of step 1, 2, ...
    PRIMARY KEY (night, cell)
);
