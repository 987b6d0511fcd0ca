//! What the effects tests on both SQL stores share: effect rows written in SQL, and the SQL rendered for each
//! database.

use chrono::Utc;

/// A pending effect, due an hour ago (`BYTES` and `PAST` rendered by [`on_postgres`] or [`on_sqlite`]).
pub const PENDING: &str = "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'n', 'crm', BYTES, '{}', 'k', 'pending', PAST, PAST, PAST)";

/// `sql` for PostgreSQL: `BYTES` a one-byte `bytea`, `PAST` an hour before the database's now.
pub fn on_postgres(sql: &str) -> String {
    sql.replace("BYTES", "'\\x00'::bytea")
        .replace("PAST", "now() - interval '1 hour'")
}

/// `sql` for SQLite: `BYTES` a one-byte blob, `PAST` an hour before the host's now.
pub fn on_sqlite(sql: &str) -> String {
    let past = (Utc::now() - chrono::Duration::hours(1))
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    sql.replace("BYTES", "x'00'")
        .replace("PAST", &format!("'{past}'"))
}
