//! The executor contract: run an effect, and say whether it happened.

use std::time::Duration;

use futures::future::BoxFuture;

use super::ClaimedEffect;
use crate::error::BoxError;

/// What an execution did. Each variant is a claim about the destination: report [`Execution::Done`] only
/// when the destination said it did it.
#[derive(Debug)]
#[non_exhaustive]
pub enum Execution {
    /// The destination did it (or had done it under this key).
    Done {
        /// Its reference (the created task's id); `None` when the destination gave none (shown apart as "done
        /// without reference").
        reference: Option<String>,
    },
    /// Nothing reached the destination, or it said it did nothing and to come back (connection refused,
    /// 429, 503 with `Retry-After`): sent again after a backoff, no sooner than `retry_after`.
    NotSent {
        /// Why.
        error: BoxError,
        /// The destination's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// The destination refused it and did nothing (a 4xx): failed, not retried. An effect whose earlier call
    /// may have happened is not failed but needs attention.
    Rejected {
        /// Why (with the evidence: the answer, the request body's hash).
        error: BoxError,
    },
    /// The destination is still processing a request with this key (the IETF httpapi draft's 409): not a
    /// refusal and not final. Reconciled after a backoff (no sooner than `retry_after`), never failed.
    InProgress {
        /// What the destination said.
        error: BoxError,
        /// The destination's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
    /// The call may have had an effect and its answer was lost or does not say (a timeout, a connection reset,
    /// a gateway's 502/504, a 2xx without the declared reference): reconciled before any retry.
    Uncertain {
        /// Why.
        error: BoxError,
    },
}

impl Execution {
    /// [`Execution::NotSent`] without a `Retry-After`.
    pub fn not_sent(error: impl Into<BoxError>) -> Self {
        Execution::NotSent {
            error: error.into(),
            retry_after: None,
        }
    }

    /// [`Execution::Uncertain`].
    pub fn uncertain(error: impl Into<BoxError>) -> Self {
        Execution::Uncertain {
            error: error.into(),
        }
    }

    /// [`Execution::Rejected`].
    pub fn rejected(error: impl Into<BoxError>) -> Self {
        Execution::Rejected {
            error: error.into(),
        }
    }
}

/// What the destination says about an effect when asked by key or reference.
#[derive(Debug)]
#[non_exhaustive]
pub enum Confirmation {
    /// It happened; here is its reference. Say so only when the destination's answer shows it (an HTTP search
    /// that answers 200 with an empty list has found nothing).
    Done {
        /// Its reference.
        reference: Option<String>,
    },
    /// It did not happen: run it again, with the same key.
    NotFound,
    /// The call deduplicates by itself (an upsert by URL, a key the destination keeps): sending it again with
    /// the same key is the confirmation. The runner calls again; the effect stays "may have happened" until
    /// the destination answers.
    Repeat,
    /// No answer, or an answer that does not say: still uncertain.
    Unknown {
        /// Why.
        error: BoxError,
    },
    /// The destination did not take the question: it asked to be asked later (a 429, a 503 with
    /// `Retry-After`, a 4xx that says it is a rate limit: `http::rate_limited`, feature `http`), or nothing
    /// reached it (a connection refused). It says nothing about the effect: still
    /// uncertain, asked again after a backoff and no sooner than `retry_after`. Counted as a reconciliation,
    /// toward the limit after which the effect needs attention, as an unknown answer is.
    NotAnswered {
        /// Why.
        error: BoxError,
        /// The destination's `Retry-After`, if it gave one.
        retry_after: Option<Duration>,
    },
}

/// Runs effects of one destination and answers for them. `execute` must send the idempotency key when the
/// destination honours one; `confirm` is the confirmation (by key or external reference, or
/// [`Confirmation::Repeat`] for a call the destination deduplicates) that makes a lost answer recoverable:
/// without one the executor answers [`Confirmation::Unknown`] and an uncertain effect ends in needs attention.
///
/// Everything the signatures use is re-exported by [`crate::effects`] ([`BoxFuture`], [`BoxError`]); see the
/// module docs for an example.
pub trait EffectExecutor: Send + Sync + 'static {
    /// Runs the effect.
    fn execute<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Execution>;

    /// Asks the destination whether the effect happened.
    fn confirm<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation>;

    /// Undoes a done effect (an operator's compensation); unsupported unless the executor says otherwise.
    fn compensate<'a>(&'a self, effect: &'a ClaimedEffect) -> BoxFuture<'a, Result<(), BoxError>> {
        let _ = effect;
        Box::pin(async { Err("this destination has no compensation".into()) })
    }

    /// How long after a call became uncertain the destination can answer for it (a search index that lags
    /// behind the writes): the first reconciliation waits this long (default: none).
    fn reconcile_after(&self) -> Duration {
        Duration::ZERO
    }

    /// SHA-256 (hex) of the request body `execute` sends for `effect`, recorded with the first call as
    /// evidence for a later "key reused with another body" (default: none).
    fn request_hash(&self, effect: &ClaimedEffect) -> Option<String> {
        let _ = effect;
        None
    }
}
