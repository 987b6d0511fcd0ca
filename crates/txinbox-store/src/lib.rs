//! # txinbox-store
//!
//! The inbox transaction on sqlx, for PostgreSQL (feature `postgres`, production) and SQLite (feature
//! `sqlite`, the embedded default).
//!
//! ```text
//! BEGIN
//!   INSERT inbox marker ... ON CONFLICT DO NOTHING      -- the unique constraint decides
//!     conflict, same hash   -> Duplicate          (rollback, ack)
//!     conflict, other hash  -> PayloadCollision   (rollback, evidence, dead-letter)
//!     conflict, business key-> BusinessDuplicate  (rollback, evidence, ack)
//!   handler(&mut tx, &msg)                        -- the user's change, same transaction
//!   outbox rows                                   -- same transaction
//! COMMIT
//! ack                                             -- only after COMMIT
//! ```
//!
//! The handler gets the open transaction's connection and never the delivery, so it cannot commit early or
//! acknowledge before COMMIT. Migrations are owned by the store ([`Store::from_pool`] applies them) and live in
//! `migrations/postgres` and `migrations/sqlite`; they use their own version table (`txinbox_schema_version`),
//! so they do not interfere with the application's own sqlx migrations.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
mod conns;
pub mod error;
pub mod handler;
pub mod inbox;
pub mod outbox;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;

pub use backend::Backend;
pub use error::{is_transient, StoreError};
pub use handler::{db_error, handler_fn, FnHandler, Handled, Handler, Inbound};
pub use inbox::{BodyFormat, Crashed, FaultPoint, Inbox, InboxProcessor, InputRules};
pub use outbox::{relay_outbox, RelayReport};
pub use store::Store;

/// sqlx, re-exported so users name the same version the store is built on.
pub use sqlx;

/// Inspection helpers for tests, the lab and operators.
pub mod inspect {
    use crate::backend::Backend;

    /// Counts inbox rows of `consumer`.
    pub async fn inbox_rows<DB: Backend>(
        pool: &sqlx::Pool<DB>,
        consumer: &str,
    ) -> Result<i64, sqlx::Error> {
        DB::count_markers(pool, consumer).await
    }
}
