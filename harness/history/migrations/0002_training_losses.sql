-- Version 2: a training case's loss per step (step 1 first), so a curve that drifts night over night shows.
CREATE TABLE losses (
    night INTEGER NOT NULL REFERENCES nights (id),
    test INTEGER NOT NULL REFERENCES tests (id),
    step INTEGER NOT NULL,
    loss REAL NOT NULL,
    PRIMARY KEY (night, test, step)
) WITHOUT ROWID;

CREATE INDEX nights_by_date ON nights (night_date, id);
