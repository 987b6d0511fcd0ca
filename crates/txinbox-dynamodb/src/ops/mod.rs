//! Read-only queries for an operator on a DynamoDB store: one consumer's figures, one message's story, and
//! a consumer's rejections (`txinbox inbox stats|show|rejections --store dynamodb://TABLE`).
//!
//! The results are the core's [`txinbox_core::store::ops`] types, which every store returns; a rejection's id
//! is the evidence item's UUID ([`RejectionId::Uuid`]).
//!
//! ## What each query reads
//!
//! Every read goes through a key: a `GetItem` of one item, or a `Query` of one partition of the
//! `by_consumer` index (eventually consistent, as every index read). A `Query` is billed for every item it
//! reads from the partition's key range, about **0.5 read unit per 4 KB** read (eventually consistent),
//! whatever its filter or projection keeps and even with `Select=COUNT`: a filter only trims the answer.
//! There is no scan anywhere, and no way to list consumers (no index has them), so every query names its
//! consumer.
//!
//! | query | reads |
//! |---|---|
//! | [`DynamoStore::consumer_stats`](crate::DynamoStore::consumer_stats) | the consumer's marker partition and evidence partition (every item not yet deleted by the TTL), and the 8 effect shards (every effect of every consumer) |
//! | [`DynamoStore::message_story`](crate::DynamoStore::message_story) | one `GetItem` (the marker), the consumer's evidence partition, and either one `GetItem` per effect name given or the 8 effect shards |
//! | [`DynamoStore::rejections`](crate::DynamoStore::rejections) | the consumer's evidence partition between `since` and `until`, newest first, until `limit` rows of the kind asked are found |
//!
//! Expired items (`expires_at` passed, not yet deleted by the TTL) are left out, as the store treats them:
//! absent from that second on. They are still read, and billed, until the TTL deletes them.

mod partition;
mod queries;
mod rows;
#[cfg(test)]
mod tests;

pub use txinbox_core::store::ops::{
    ConsumerStats, EffectView, MarkerView, MessageStory, RejectionFilter, RejectionId,
    RejectionRow, MAX_REJECTIONS, REJECTION_KINDS, WAITING_EFFECT_STATES,
};
