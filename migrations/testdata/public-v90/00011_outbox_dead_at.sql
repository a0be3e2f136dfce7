-- +goose Up
-- outbox.dead_at records when a row went dead, so that operators can filter
-- and purge outbox dead letters by age. It is set by a trigger whose WHEN
-- clause is evaluated without calling any function, so the relay's marks of
-- published rows pay nothing for it.
ALTER TABLE outbox ADD COLUMN dead_at timestamptz;

-- +goose StatementBegin
CREATE FUNCTION outbox_set_dead_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.dead_at := now();
    RETURN NEW;
END;
$$;
-- +goose StatementEnd

CREATE TRIGGER outbox_set_dead_at BEFORE UPDATE OF status ON outbox
    FOR EACH ROW WHEN (NEW.status = 'dead' AND OLD.status IS DISTINCT FROM 'dead')
    EXECUTE FUNCTION outbox_set_dead_at();

-- +goose Down
DROP TRIGGER outbox_set_dead_at ON outbox;
DROP FUNCTION outbox_set_dead_at();
ALTER TABLE outbox DROP COLUMN dead_at;
