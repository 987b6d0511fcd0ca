-- The purge of finished effects reads an index. Maintenance deletes effects done or compensated before their
-- keep (`state IN ('done', 'compensated') AND finished_at < $1`), the effects runner those done before its
-- retention (`state = 'done' AND finished_at < $1`); the index on done effects alone served only the second,
-- so every batch of the first read the whole table. This index serves both: a bound on `finished_at` implies
-- it is not null, on PostgreSQL and on SQLite alike. It is built before the old one is dropped.
CREATE INDEX txinbox_effects_finished ON txinbox_effects (state, finished_at) WHERE finished_at IS NOT NULL;
DROP INDEX txinbox_effects_done;
