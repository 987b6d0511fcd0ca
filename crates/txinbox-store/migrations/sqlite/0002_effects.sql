-- External effects: intents written in the inbox transaction, run after COMMIT with their idempotency key.
-- The outbox table of 0001 is retired: messages to publish are effects too (destination = the broker queue).
CREATE TABLE txinbox_effects (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    consumer_name    TEXT    NOT NULL,
    message_id       TEXT    NOT NULL,
    idempotency_key  TEXT    NOT NULL UNIQUE,
    name             TEXT    NOT NULL,
    destination      TEXT    NOT NULL,
    payload          BLOB    NOT NULL,
    metadata         TEXT    NOT NULL,
    external_ref     TEXT    NOT NULL,
    group_key        TEXT,
    state            TEXT    NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    reconciliations  INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  TEXT    NOT NULL,
    claimed_by       TEXT,
    claim_until      TEXT,
    result_reference TEXT,
    last_error       TEXT,
    created_at       TEXT    NOT NULL,
    updated_at       TEXT    NOT NULL,
    finished_at      TEXT
);
CREATE INDEX txinbox_effects_due ON txinbox_effects (next_attempt_at, id) WHERE state IN ('pending', 'uncertain');
CREATE INDEX txinbox_effects_claims ON txinbox_effects (claim_until) WHERE state = 'in_flight';
CREATE INDEX txinbox_effects_groups ON txinbox_effects (consumer_name, group_key, id)
    WHERE group_key IS NOT NULL AND state NOT IN ('done', 'failed');
CREATE INDEX txinbox_effects_done ON txinbox_effects (finished_at) WHERE state = 'done';
CREATE INDEX txinbox_effects_ref ON txinbox_effects (external_ref);
