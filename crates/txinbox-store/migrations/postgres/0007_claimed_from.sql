-- A claim keeps the state it took the effect from. A claim whose answer was lost (the connection dropped after
-- its COMMIT) held its effects under a runner that never ran them, until the claim ran out; their next holder
-- then took them as possibly started. The runner gives such a claim back (by holder and claim_until): each
-- effect returns to the state this column kept, so one that was never called is not reconciled as started.
ALTER TABLE txinbox_effects ADD COLUMN claimed_from TEXT;
