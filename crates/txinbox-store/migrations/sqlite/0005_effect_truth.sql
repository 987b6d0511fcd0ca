-- Effects tell what happened: an effect whose call may have happened (an uncertain answer no confirmation has
-- ruled out since) is never marked failed, and the request body hash of the first call is kept as evidence
-- when a destination answers that the key was used with another body.
ALTER TABLE txinbox_effects ADD COLUMN maybe_happened BOOLEAN NOT NULL DEFAULT 0;
ALTER TABLE txinbox_effects ADD COLUMN sent_hash TEXT;
UPDATE txinbox_effects SET maybe_happened = 1 WHERE state IN ('uncertain', 'in_flight', 'needs_attention');
