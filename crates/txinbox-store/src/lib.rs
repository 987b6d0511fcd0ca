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
//! ## The schema
//!
//! By default a store applies its migrations when it opens (idempotent, one migrator at a time, quiet on an
//! up-to-date database). [`StoreOptions::migrations`] chooses instead to verify that your own migration tool
//! applied them ([`Migrations::Verify`], with the script from [`Store::migration_sql`] or `txinbox schema`)
//! or to skip the check. [`StoreOptions::schema`] puts the tables in a PostgreSQL schema of your choice. The
//! migrations live in `migrations/postgres` and `migrations/sqlite` and record themselves in their own
//! version table, `txinbox_schema_version`, so they never touch your sqlx migrations.
//!
//! | table | what it holds |
//! |---|---|
//! | `txinbox_inbox` | one marker per applied message: `consumer_name, source, message_id` (primary key), `event_type, business_key` (unique per consumer), `payload_hash, contract_version, tenant_id, received_at, processed_at, result_reference, retention_until, id_origin, delivery_count` |
//! | `txinbox_rejections` | evidence of payload collisions and business duplicates: the rejected identity, `kind`, its hash, what it conflicts with, detail, time |
//! | `txinbox_effects` | external effects: intents written in the inbox transaction, with their idempotency key, state, attempts, claim and the destination's reference |
//! | `txinbox_outbox` | retired by migration 2 (messages to publish are effects); kept so no row is lost on upgrade |
//! | `txinbox_schema_version` | the applied migrations |
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod backend;
mod conns;
mod effects;
pub mod error;
mod health;
pub mod ops;
pub mod partitions;
#[cfg(feature = "postgres")]
mod pg_url;
#[cfg(all(test, feature = "postgres", feature = "sqlite"))]
mod plans;
#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;
pub mod store;
mod tx;

pub use backend::{Backend, Migration};
pub use error::{is_transient, StoreError};
pub use partitions::{PartitionOptions, PartitionReport, PartitionStatus};
#[cfg(feature = "postgres")]
pub use pg_url::pg_connect_options;
pub use store::{Migrations, Store, StoreOptions};
pub use tx::Tx;

/// sqlx, re-exported so users name the same version the store is built on.
pub use sqlx;
