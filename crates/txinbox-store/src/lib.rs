//! # txinbox-store
//!
//! The sqlx stores of the inbox: PostgreSQL (feature `postgres`, production) and SQLite (feature `sqlite`, the
//! embedded default). A store is a database driver behind [`txinbox_core::InboxStore`]: it runs the inbox's
//! statements (BEGIN, the marker insert under the unique constraints, the result and outbox rows, COMMIT,
//! evidence rows, purges) and keeps no policy; every decision is made by the core's pipeline.
//!
//! A handler writes its business change through the open transaction, [`Tx`], like through any sqlx
//! executor: `sqlx::query("INSERT ..").bind(..).execute(&tx).await?`.
//!
//! Migrations are owned by the store ([`Store::from_pool`] applies them) and live in `migrations/postgres`
//! and `migrations/sqlite`; they use their own version table (`txinbox_schema_version`), so they do not
//! interfere with the application's own sqlx migrations.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
mod conns;
pub mod error;
pub mod outbox;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
mod tx;

pub use backend::Backend;
pub use error::{is_transient, StoreError};
pub use outbox::{relay_outbox, RelayReport};
pub use store::Store;
pub use tx::Tx;

/// sqlx, re-exported so users name the same version the store is built on.
pub use sqlx;
