//! Read-only queries for an operator: per-consumer statistics, one message's story, and the rejections
//! (`txinbox inbox stats|show|rejections`).
//!
//! Every query is bounded by an index (migration 3 adds the ones the inbox did not have): a consumer's rows
//! are counted on `txinbox_inbox (consumer_name, processed_at)` (an index-only scan), a message is found by
//! its primary key (without its source, by a skip scan over the consumer's sources), rejections are read
//! newest first from `txinbox_rejections (consumer_name, recorded_at, id)` or `(recorded_at, id)`, and effects
//! from `txinbox_effects (consumer_name, message_id)` and `(consumer_name, state, created_at)`. Consumers are
//! listed with a skip scan over each table's leading `consumer_name` column, never a full scan.
//!
//! The methods are inherent to [`Store<sqlx::Postgres>`](crate::Store) and [`Store<sqlx::Sqlite>`](crate::Store)
//! (each behind its feature). They only read: a connection opened read-only (PostgreSQL's
//! `default_transaction_read_only`) serves them. The results are the core's
//! [`txinbox_core::store::ops`] types, which every store returns.

// Without a backend feature only the result types remain.
#![cfg_attr(not(any(feature = "postgres", feature = "sqlite")), allow(dead_code))]

mod queries;
mod rows;
mod sql;

#[cfg(feature = "postgres")]
mod pg;

#[cfg(feature = "sqlite")]
mod lite;

#[cfg(test)]
mod tests;

pub use txinbox_core::store::ops::{
    ConsumerStats, EffectView, MarkerView, MessageStory, RejectionFilter, RejectionId,
    RejectionRow, MAX_REJECTIONS, REJECTION_KINDS, WAITING_EFFECT_STATES,
};

/// The most consumers listed by [`ConsumerStats`] queries without a consumer (a bound on the skip scan).
pub const MAX_CONSUMERS: i64 = 10_000;
