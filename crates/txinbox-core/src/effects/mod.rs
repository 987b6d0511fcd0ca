//! External effects as governed units: what a handler wants done outside the database (create a task in a CRM,
//! send an e-mail, charge a card, publish to a broker), recorded in the inbox transaction and run after COMMIT.
//!
//! ```text
//! pending ──claim──▶ in flight ──the destination said it did it──▶ done (its reference kept)
//!                       │  ├──nothing reached it (connect error, 429, 503 + Retry-After)──▶ pending (backoff)
//!                       │  ├──it refused and nothing happened (4xx)──▶ failed (evidence kept)
//!                       │  └──may have happened (timeout, 502/504, 409 key in progress, holder died)──▶ uncertain
//! uncertain ──reconcile (ask the destination, or repeat a call it deduplicates)──▶ done
//!                                                 | not found: run again with the SAME key
//!                                                 | no answer: uncertain (backoff) ──limit──▶ needs attention
//! ```
//!
//! * **The intent** ([`Effect`]) commits with the marker and the business change, or not at all.
//! * **The idempotency key** ([`idempotency_key`]) is derived from the message identity and the effect's name:
//!   the same on every redelivery and every retry, sent to the destination (HTTP: a header, a body field, or
//!   the URL of an upsert), and stored with the effect.
//! * **The runner** ([`EffectRunner`]) claims due effects (a claim expires when its holder dies; on PostgreSQL
//!   several runners never hold one effect at once), runs them through the [`EffectExecutor`] registered for
//!   their destination, and records the result.
//! * **Nothing is reported done that did not happen.** `done` only when the destination answered that it did
//!   it, or a confirmation found it; `failed` only when the destination refused and nothing happened (an effect
//!   whose earlier call may have happened is never failed: it needs attention). Everything else is pending,
//!   uncertain or needs attention.
//! * **A lost answer is uncertain, never silently pending.** An uncertain effect, and one whose holder died
//!   mid-call, is **reconciled before any retry**: the executor asks the destination by key or external
//!   reference ([`EffectExecutor::confirm`]); found means done, not found means run again with the same key,
//!   no answer means uncertain again (with backoff) and, after a limit, needs attention. A call the
//!   destination deduplicates by itself (an upsert by URL, a key it keeps) may be repeated instead
//!   ([`Confirmation::Repeat`]).
//! * Each effect has its own backoff and attempt limit, so a failing one never blocks the others; order is
//!   kept only within a [group](Effect::group) the user names.
//!
//! A custom executor implements [`EffectExecutor`]; everything its signature uses is re-exported here
//! ([`BoxFuture`], [`BoxError`]):
//!
//! ```
//! use txinbox_core::effects::{BoxFuture, ClaimedEffect, Confirmation, EffectExecutor, Execution};
//!
//! /// Sends an SMS through a provider's client (here a stand-in that always succeeds).
//! struct Sms;
//!
//! impl EffectExecutor for Sms {
//!     fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
//!         Box::pin(async move {
//!             // send effect.payload with effect.key as the provider's idempotency key ...
//!             Execution::Done { reference: Some(format!("sms-{}", effect.key)) }
//!         })
//!     }
//!     fn confirm<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
//!         Box::pin(async move {
//!             // ask the provider whether a message with this key exists ...
//!             let _ = effect;
//!             Confirmation::NotFound
//!         })
//!     }
//! }
//! ```

use std::collections::BTreeMap;
use std::fmt;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::pipeline::identity::Identity;

mod executor;
mod gauges;
mod options;
pub mod outbox;
mod runner;
mod store;

pub use executor::{Confirmation, EffectExecutor, Execution};
pub use futures::future::BoxFuture;
pub use gauges::publish_gauges;
pub use options::{CompensateError, CompensatedRow, EffectOptions, EffectReport, RowOutcome};
pub use runner::EffectRunner;
pub use store::{
    claim_end, ClaimedEffect, EffectCount, EffectStore, Transition, TransitionColumns,
    MAX_ERROR_LEN, MAX_REFERENCE_LEN, MAX_SENT_HASH_LEN,
};

pub use crate::error::BoxError;

/// What a handler wants done outside the database, recorded in the inbox transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Effect {
    /// The effect's name within the message (`crm.create_task`): part of the idempotency key, so one message
    /// may ask for several effects.
    pub name: String,
    /// The destination: the name an [`EffectExecutor`] is registered under.
    pub destination: String,
    /// What to send (an HTTP body, a message body).
    pub payload: Vec<u8>,
    /// Extra fields the executor reads (HTTP headers, a message's attributes).
    pub metadata: BTreeMap<String, String>,
    /// A reference the destination can be searched by (default: the idempotency key).
    pub external_ref: Option<String>,
    /// Effects of one group run in the order they were recorded, one at a time (default: none, no order).
    pub group: Option<String>,
}

impl Effect {
    /// An effect `name` for `destination` with `payload`.
    pub fn new(
        name: impl Into<String>,
        destination: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        Self {
            name: name.into(),
            destination: destination.into(),
            payload: payload.into(),
            metadata: BTreeMap::new(),
            external_ref: None,
            group: None,
        }
    }

    /// An effect whose payload is `value` as JSON.
    pub fn json<T: serde::Serialize>(
        name: impl Into<String>,
        destination: impl Into<String>,
        value: &T,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self::new(name, destination, serde_json::to_vec(value)?))
    }

    /// Sets a metadata field.
    pub fn metadata(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// Sets the reference the destination can be searched by.
    pub fn external_ref(mut self, r: impl Into<String>) -> Self {
        self.external_ref = Some(r.into());
        self
    }

    /// Runs this effect in order with the others of `group`.
    pub fn group(mut self, group: impl Into<String>) -> Self {
        self.group = Some(group.into());
        self
    }
}

/// The idempotency key of effect `name` of the message `identity`: 32 hex digits of SHA-256 over the consumer,
/// the source, the message id and the name. The same on every redelivery of the message and every retry of the
/// effect; different for another consumer, message or effect. Safe in an HTTP header.
pub fn idempotency_key(identity: &Identity, name: &str) -> String {
    let mut h = Sha256::new();
    for part in [
        identity.consumer.as_str(),
        identity.source.as_str(),
        identity.message_id.as_str(),
        name,
    ] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(32);
    for b in &digest[..16] {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// An effect as the store writes it in the inbox transaction.
#[derive(Debug)]
#[non_exhaustive]
pub struct NewEffect<'a> {
    /// The consumer whose message asked for it.
    pub consumer: &'a str,
    /// The message id.
    pub message_id: &'a str,
    /// Its idempotency key.
    pub key: String,
    /// The intent.
    pub effect: &'a Effect,
    /// When it was recorded, by the worker's clock. A store with a clock of its own records its own instead
    /// (PostgreSQL: the transaction's `now()`), on which its claims decide when the effect is due.
    pub created_at: DateTime<Utc>,
}

/// The state of an effect, with names an operator understands.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum EffectState {
    /// Recorded, waiting for its turn (or for its backoff after a call that sent nothing).
    Pending,
    /// Claimed by a runner, being executed or reconciled.
    InFlight,
    /// The destination did it; its reference is kept.
    Done,
    /// A call may have had an effect and its answer was lost: reconciled before any retry.
    Uncertain,
    /// The destination refused it, or every attempt failed: evidence kept, not retried.
    Failed,
    /// Reconciliation could not decide within its limit: an operator must look.
    NeedsAttention,
    /// Done, then undone by an operator's compensation.
    Compensated,
}

impl EffectState {
    /// Every state.
    pub const ALL: [EffectState; 7] = [
        EffectState::Pending,
        EffectState::InFlight,
        EffectState::Done,
        EffectState::Uncertain,
        EffectState::Failed,
        EffectState::NeedsAttention,
        EffectState::Compensated,
    ];

    /// The stored name (`pending`, `in_flight`, `done`, `uncertain`, `failed`, `needs_attention`).
    pub fn as_str(self) -> &'static str {
        match self {
            EffectState::Pending => "pending",
            EffectState::InFlight => "in_flight",
            EffectState::Done => "done",
            EffectState::Uncertain => "uncertain",
            EffectState::Failed => "failed",
            EffectState::NeedsAttention => "needs_attention",
            EffectState::Compensated => "compensated",
        }
    }

    /// Whether an effect in this state is finished: done, failed or compensated. One that is not (pending, in
    /// flight, uncertain, needs attention) may still run, or may have happened at the destination.
    pub fn is_finished(self) -> bool {
        matches!(
            self,
            EffectState::Done | EffectState::Failed | EffectState::Compensated
        )
    }

    /// The state stored as `s`.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

impl fmt::Display for EffectState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
