-- +goose Up
-- relay_partitions holds one lease per outbox partition. A relay owns a
-- partition while lease_until is in the future; every acquisition bumps epoch,
-- the fencing token checked when rows are marked published.
CREATE TABLE relay_partitions (
    partition   integer     PRIMARY KEY,
    owner       text,
    epoch       bigint      NOT NULL DEFAULT 0,
    lease_until timestamptz NOT NULL DEFAULT '-infinity',
    acquired_at timestamptz
);
INSERT INTO relay_partitions (partition)
SELECT p FROM generate_series(0, outbox_partition_count() - 1) AS p;

-- relay_nodes lists the running relays (by heartbeat), so each can take its
-- fair share of the partitions.
CREATE TABLE relay_nodes (
    node_id   text        PRIMARY KEY,
    last_seen timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE relay_nodes;
DROP TABLE relay_partitions;
