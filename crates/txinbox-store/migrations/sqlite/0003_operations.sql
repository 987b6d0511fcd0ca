-- Operator queries (`txinbox inbox stats|show|rejections`): every one is bounded by an index.
-- Markers of a consumer by processing time: the oldest marker, the last hour's growth, and an index-only
-- count of a consumer's rows (this index is narrower than the primary key).
CREATE INDEX txinbox_inbox_processed ON txinbox_inbox (consumer_name, processed_at);
-- Rejections, newest first: of one consumer, and of all consumers.
CREATE INDEX txinbox_rejections_consumer_time ON txinbox_rejections (consumer_name, recorded_at, id);
CREATE INDEX txinbox_rejections_time ON txinbox_rejections (recorded_at, id);
-- A message's rejections (with or without its source).
CREATE INDEX txinbox_rejections_message ON txinbox_rejections (consumer_name, message_id);
-- A message's effects.
CREATE INDEX txinbox_effects_message ON txinbox_effects (consumer_name, message_id);
-- Effects of a consumer by state, with the oldest of each (the effect lag): an index-only scan.
CREATE INDEX txinbox_effects_state ON txinbox_effects (consumer_name, state, created_at);
