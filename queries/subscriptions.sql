-- name: InboxSubscriptions :many
-- InboxSubscriptions lists the handlers events are stored for when the relay
-- delivers straight into this database (broker/postgres).
SELECT handler, dedup_key, dedup_key_by_topic, topics
FROM pgrelay.inbox_subscriptions
ORDER BY handler;

-- name: UpsertInboxSubscription :exec
-- UpsertInboxSubscription registers a handler (or replaces its settings).
INSERT INTO pgrelay.inbox_subscriptions (handler, dedup_key, dedup_key_by_topic, topics, updated_at)
VALUES (@handler, @dedup_key, @dedup_key_by_topic, sqlc.narg('topics')::text[], pg_catalog.now())
ON CONFLICT (handler) DO UPDATE
SET dedup_key = EXCLUDED.dedup_key, dedup_key_by_topic = EXCLUDED.dedup_key_by_topic,
    topics = EXCLUDED.topics, updated_at = pg_catalog.now()
WHERE (inbox_subscriptions.dedup_key, inbox_subscriptions.dedup_key_by_topic, inbox_subscriptions.topics)
      IS DISTINCT FROM (EXCLUDED.dedup_key, EXCLUDED.dedup_key_by_topic, EXCLUDED.topics);

-- name: DeleteInboxSubscription :execrows
-- DeleteInboxSubscription unsubscribes a handler.
DELETE FROM pgrelay.inbox_subscriptions WHERE handler = @handler;
