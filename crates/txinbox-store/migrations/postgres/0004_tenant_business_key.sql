-- A business key is unique per consumer AND tenant: two tenants asking for the same business action (the same
-- key text) both apply. A message without a tenant is in the tenant '' (the keys of untenanted messages stay
-- unique per consumer, as before). The new index is built before the old one is dropped, so the constraint is
-- never absent; building it holds a lock that blocks inserts into txinbox_inbox for the build's duration
-- (measure it on a copy of a large table before applying in production).
CREATE UNIQUE INDEX txinbox_inbox_tenant_business_key
    ON txinbox_inbox (consumer_name, (COALESCE(tenant_id, '')), business_key) WHERE business_key IS NOT NULL;
DROP INDEX txinbox_inbox_business_key;
