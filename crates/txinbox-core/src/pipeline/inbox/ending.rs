//! How a delivery ends: a failure turned into its decision (released for a retry, or dead-lettered), a refused
//! marker read (duplicate, payload collision, business duplicate), and the decision settled on the broker, only
//! after COMMIT.

use std::time::Duration;

use chrono::Utc;

use crate::broker::{DeadLetter, Delivery};
use crate::error::BadInput;
use crate::metrics as m;
use crate::pipeline::handler::{HandlerError, Retry};
use crate::pipeline::outcome::Outcome;
use crate::store::{ExistingMarker, InboxStore, Rejection, RejectionKind};

use super::decide::{Decision, Prepared};
use super::Inbox;

impl<S: InboxStore> Inbox<S> {
    /// Whether a retry of a delivery whose handler returned `e` can help: `Some(after)` when it can (with the
    /// delay the handler asked for, if any), `None` when it cannot.
    pub(super) fn retry_of(&self, e: &HandlerError) -> Option<Option<Duration>> {
        match e.retry_kind() {
            Retry::Yes { after } => Some(after),
            Retry::No => None,
            // An error that came through `?`: the store knows its driver's errors; anything else is retried
            // (the broker's maximum delivery count bounds it).
            Retry::Unclassified => match S::classify(e.source()) {
                Some(false) => None,
                _ => Some(None),
            },
        }
    }

    pub(super) fn handler_failed(&self, e: HandlerError) -> Decision {
        let Some(after) = self.retry_of(&e) else {
            tracing::error!(error = %e, "handler failed permanently: rolled back, dead-lettering");
            return dead_letter("handler_permanent", e.to_string());
        };
        metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "handler")
            .increment(1);
        tracing::warn!(error = %e, "handler failed, retryable: rolled back, released for redelivery");
        Decision::Release(
            Outcome::Retry {
                reason: e.to_string(),
            },
            after.unwrap_or(self.retry_backoff),
        )
    }

    pub(super) fn bad_input(&self, bad: BadInput) -> Decision {
        let consumer = self.label();
        match &bad {
            BadInput::NoIdentity { .. } | BadInput::InvalidIdentityField { .. } => {
                metrics::counter!(m::UNKNOWN_IDENTITY, "consumer" => consumer).increment(1)
            }
            BadInput::UnsupportedContractVersion { .. } => {
                metrics::counter!(m::CONTRACT_VERSION_FAILURES, "consumer" => consumer).increment(1)
            }
            _ => {}
        }
        tracing::warn!(reason = bad.reason(), error = %bad, "bad input: dead-lettering");
        dead_letter(bad.reason(), bad.to_string())
    }

    pub(super) fn interrupted(&self) -> Decision {
        metrics::counter!(m::INTERRUPTED, "consumer" => self.label()).increment(1);
        tracing::warn!("stopping before COMMIT (shutdown deadline, or a prefetched delivery at shutdown): rolled back, releasing");
        Decision::Release(Outcome::Interrupted, Duration::ZERO)
    }

    pub(super) fn store_retry(&self, op: &'static str, e: &S::Error) -> Decision {
        metrics::counter!(m::RETRIES, "consumer" => self.label(), "reason" => "store").increment(1);
        tracing::warn!(op, error = %e, transient = S::is_transient(e), "store error: rolled back, released for redelivery");
        Decision::Release(
            Outcome::Retry {
                reason: format!("{op}: {e}"),
            },
            self.retry_backoff,
        )
    }

    pub(super) async fn conflict<T>(
        &self,
        p: &Prepared<T>,
        holder: Option<ExistingMarker>,
        received_at: chrono::DateTime<Utc>,
    ) -> Decision {
        let consumer = self.label();
        let (identity, hash) = (&p.identity, p.hash.as_str());
        let Some(holder) = holder else {
            // The conflicting row vanished between the insert and the read (retention purge): try again.
            metrics::counter!(m::RETRIES, "consumer" => consumer, "reason" => "conflict_vanished")
                .increment(1);
            return Decision::Release(
                Outcome::Retry {
                    reason: "conflicting marker vanished".into(),
                },
                Duration::ZERO,
            );
        };
        // The holder began its transaction after this delivery arrived: both were in flight together.
        if holder.processed_at >= received_at {
            metrics::counter!(m::CONCURRENT_CONFLICTS, "consumer" => consumer.clone()).increment(1);
        }
        if holder.is_same_message(hash) {
            metrics::counter!(m::DUPLICATES, "consumer" => consumer).increment(1);
            tracing::info!(message_id = %identity.message_id, "duplicate: already applied, no effect");
            return Decision::Ack(Outcome::Duplicate {
                result_reference: holder.result_reference,
            });
        }
        let (kind, detail, conflicts_with) = if holder.same_identity {
            metrics::counter!(m::PAYLOAD_COLLISIONS, "consumer" => consumer).increment(1);
            tracing::error!(message_id = %identity.message_id, stored_hash = %holder.payload_hash, received_hash = %hash, "payload collision: same id, other content; not applied, dead-lettering for investigation");
            (
                RejectionKind::PayloadCollision,
                format!(
                    "message id {} was applied with payload hash {}; this copy has {}",
                    identity.message_id, holder.payload_hash, hash
                ),
                holder.payload_hash.as_str(),
            )
        } else {
            metrics::counter!(m::BUSINESS_DUPLICATES, "consumer" => consumer).increment(1);
            tracing::warn!(message_id = %identity.message_id, holder = %holder.message_id, business_key = ?identity.business_key, "business duplicate: another message applied this business key; no effect");
            (
                RejectionKind::BusinessDuplicate,
                format!(
                    "business key {} already applied by message {}",
                    identity.business_key.as_deref().unwrap_or_default(),
                    holder.message_id
                ),
                holder.message_id.as_str(),
            )
        };
        let rej = Rejection {
            identity,
            kind,
            payload_hash: hash,
            conflicts_with,
            detail: &detail,
            recorded_at: Utc::now(),
        };
        if let Err(e) = self.store.record_rejection(&rej).await {
            // Without the evidence row, do not settle: the redelivery will try to record it again.
            return self.store_retry("record rejection", &e);
        }
        match kind {
            RejectionKind::PayloadCollision => Decision::DeadLetter(
                Outcome::PayloadCollision {
                    stored_hash: holder.payload_hash,
                    received_hash: hash.to_owned(),
                },
                DeadLetter::new(kind.as_str(), detail),
            ),
            RejectionKind::BusinessDuplicate => Decision::Ack(Outcome::BusinessDuplicate {
                holder_message_id: holder.message_id,
                result_reference: holder.result_reference,
            }),
        }
    }

    /// Settles `delivery` as `decision` says and returns its outcome, whatever the settle answers: an error, or
    /// a panic in the broker's code (the adapter, or a wrapper of the delivery), is a settle failure
    /// (`txinbox_settle_failures_total{op}`), never another outcome. The decision is final (after COMMIT for an
    /// applied delivery): a message whose settle failed comes back after its lock or visibility timeout and
    /// the inbox absorbs it as a duplicate.
    pub(super) async fn settle<D: Delivery>(&self, delivery: D, decision: Decision) -> Outcome {
        use futures::FutureExt;
        let consumer = self.label();
        let (op, result, outcome) = match decision {
            Decision::Ack(o) => ("ack", contained(delivery.ack()).await, o),
            Decision::Release(o, after) => ("release", contained(delivery.release(after)).await, o),
            Decision::DeadLetter(o, why) => {
                metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => why.reason.clone()).increment(1);
                ("dead_letter", contained(delivery.dead_letter(why)).await, o)
            }
        };
        /// Runs a settle, its panic caught: the outcome was decided before it (an applied delivery committed).
        async fn contained(
            settle: impl std::future::Future<Output = Result<(), crate::BrokerError>>,
        ) -> Result<Result<(), crate::BrokerError>, String> {
            std::panic::AssertUnwindSafe(settle)
                .catch_unwind()
                .await
                .map_err(|p| panic_text(p.as_ref()))
        }
        match result {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                // Applied while our lock was lost: another copy was out at the same time (the lock-lost race).
                if matches!(outcome, Outcome::Applied { .. })
                    && e.kind() == crate::BrokerErrorKind::LockLost
                {
                    metrics::counter!(m::CONCURRENT_CONFLICTS, "consumer" => consumer.clone())
                        .increment(1);
                }
                metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => op)
                    .increment(1);
                tracing::warn!(op, error = %e, outcome = outcome.label(), "settle failed; the broker will redeliver and the inbox absorbs it");
            }
            Err(panic) => {
                // A bug in the broker's code, not in the delivery: what was decided stands (an applied delivery
                // is committed), only its settle did not happen.
                metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => op)
                    .increment(1);
                tracing::error!(op, panic = %panic, outcome = outcome.label(), "settle panicked; the broker will redeliver and the inbox absorbs it");
            }
        }
        outcome
    }
}

/// The message of a caught panic (a `&str` or a `String` payload) for its log line, the secrets it may quote
/// (an endpoint's signature in an unwrapped error) masked.
fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    let text = p
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned());
    crate::error::redact_secrets(&text)
}

pub(super) fn dead_letter(reason: &str, detail: String) -> Decision {
    Decision::DeadLetter(
        Outcome::DeadLettered {
            reason: reason.to_owned(),
            detail: detail.clone(),
        },
        DeadLetter::new(reason, detail),
    )
}
