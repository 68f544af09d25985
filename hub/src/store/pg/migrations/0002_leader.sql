-- Version 2: several Hubs on one database. The identity they share (sealed with the identity
-- key file every Hub has), the leader lease with its fencing epoch, and the epoch each record
-- was last written under (0: by a Hub that takes no lease).
CREATE TABLE agen_identity (
    id integer PRIMARY KEY CHECK (id = 1),
    sealed bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE agen_leader (
    id integer PRIMARY KEY CHECK (id = 1),
    epoch bigint NOT NULL,
    holder text NOT NULL,
    url text NOT NULL,
    expires_at timestamptz NOT NULL
);

INSERT INTO agen_leader (id, epoch, holder, url, expires_at) VALUES (1, 0, '', '', '-infinity');

ALTER TABLE agen_records ADD COLUMN epoch bigint NOT NULL DEFAULT 0;
