-- Version 1: every table of the Hub's store as rows of one key/value table (the same tables,
-- keys and values as the local store), and the row a flush updates to make earlier writes
-- durable.
CREATE TABLE agen_records (
    tbl text COLLATE "C" NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    PRIMARY KEY (tbl, key)
);

CREATE TABLE agen_flush (
    id integer PRIMARY KEY,
    flushes bigint NOT NULL
);

INSERT INTO agen_flush (id, flushes) VALUES (1, 0);
