//! The lease keeper: renews a delivery's lock or visibility on a timer while its handler runs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::Lease;

/// When and how far leases are renewed.
#[derive(Clone, Debug)]
pub struct LeaseOptions {
    /// Time between renewals. Must be well below the lease duration (SQS visibility timeout, Service Bus
    /// lock duration); one third of it is a good choice.
    pub interval: Duration,
    /// How far each renewal extends the lease (from the moment of renewal).
    pub extend_by: Duration,
    /// Stop renewing after the lease has been held this long in total (SQS caps visibility at 12 hours).
    pub max_total: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(20),
            extend_by: Duration::from_secs(60),
            max_total: Duration::from_secs(2 * 3600),
        }
    }
}

impl LeaseOptions {
    /// Sets the renewal interval.
    pub fn interval(mut self, d: Duration) -> Self {
        self.interval = d;
        self
    }
    /// Sets how far each renewal extends the lease.
    pub fn extend_by(mut self, d: Duration) -> Self {
        self.extend_by = d;
        self
    }
    /// Sets the maximum total time a lease is kept.
    pub fn max_total(mut self, d: Duration) -> Self {
        self.max_total = d;
        self
    }
}

/// A running lease keeper. Stop it (or drop it) once the delivery is settled.
#[derive(Debug)]
pub struct LeaseGuard {
    cancel: CancellationToken,
    state: Arc<LeaseState>,
}

#[derive(Debug, Default)]
struct LeaseState {
    lost: AtomicBool,
    renewals: AtomicU32,
}

impl LeaseGuard {
    /// Whether a renewal failed (the lock is presumed lost).
    pub fn lost(&self) -> bool {
        self.state.lost.load(Ordering::SeqCst)
    }
    /// How many renewals succeeded.
    pub fn renewals(&self) -> u32 {
        self.state.renewals.load(Ordering::SeqCst)
    }
    /// A token that stops the keeper when cancelled (without marking the lease lost).
    pub fn stopper(&self) -> CancellationToken {
        self.cancel.clone()
    }
    /// Stops renewing.
    pub fn stop(&self) {
        self.cancel.cancel();
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts renewing `lease` every `opts.interval` until the guard is stopped or dropped, a renewal fails, or
/// `opts.max_total` is reached. A transient failure ([`crate::BrokerError::is_retryable`]) is retried on the
/// next tick while the lease has not expired. A failed renewal increments `txinbox_lease_lost_total` and logs a warning; the
/// delivery's outcome stays correct because the inbox absorbs the redelivery that may follow.
pub fn keep_alive(lease: Arc<dyn Lease>, opts: LeaseOptions, consumer: String) -> LeaseGuard {
    let cancel = CancellationToken::new();
    let state = Arc::new(LeaseState::default());
    let (c, s) = (cancel.clone(), state.clone());
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = c.cancelled() => return,
                _ = tokio::time::sleep(opts.interval) => {}
            }
            if started.elapsed() + opts.interval > opts.max_total {
                tracing::warn!(
                    consumer,
                    "lease keeper reached its maximum; the lease will expire"
                );
                return;
            }
            let renewed = tokio::select! {
                _ = c.cancelled() => return,
                r = lease.renew(opts.extend_by) => r,
            };
            match renewed {
                Ok(until) => {
                    s.renewals.fetch_add(1, Ordering::SeqCst);
                    metrics::counter!(crate::metrics::LEASE_RENEWALS, "consumer" => consumer.clone())
                        .increment(1);
                    tracing::debug!(consumer, %until, "lease renewed");
                }
                Err(e) => {
                    if c.is_cancelled() {
                        return;
                    }
                    // A transient failure (throttling, a lost answer) is retried on the next tick while the
                    // lease may still be ours; a lost lock, or a lease that has run out, ends the keeper.
                    let still_held = lease.expires_at().is_none_or(|t| t > chrono::Utc::now());
                    if e.is_retryable() && still_held {
                        tracing::warn!(consumer, error = %e, "lease renewal failed transiently; retrying on the next tick");
                        continue;
                    }
                    s.lost.store(true, Ordering::SeqCst);
                    metrics::counter!(crate::metrics::LEASE_LOST, "consumer" => consumer.clone())
                        .increment(1);
                    tracing::warn!(consumer, error = %e, "lease renewal failed; lock presumed lost, a redelivery will be absorbed by the inbox");
                    return;
                }
            }
        }
    });
    LeaseGuard { cancel, state }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::BrokerError;
    use chrono::{DateTime, Utc};
    use futures::future::BoxFuture;
    use std::sync::Mutex;

    /// Answers renewals from a script: Ok, a transient error, or a lost lock.
    struct Scripted(Mutex<Vec<Result<(), bool>>>);

    impl Lease for Scripted {
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            Some(Utc::now() + chrono::Duration::seconds(60))
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            let next = self.0.lock().unwrap().pop().unwrap_or(Ok(()));
            Box::pin(async move {
                match next {
                    Ok(()) => Ok(Utc::now()),
                    Err(true) => Err(BrokerError::Throttled {
                        detail: "429".into(),
                        source: None,
                    }),
                    Err(false) => Err(BrokerError::LockLost {
                        detail: "404".into(),
                    }),
                }
            })
        }
    }

    fn fast() -> LeaseOptions {
        LeaseOptions::default().interval(Duration::from_millis(2))
    }

    #[tokio::test]
    async fn transient_failures_are_retried_and_a_lost_lock_ends_the_keeper() {
        // Popped from the end: ok, throttled, ok, lost.
        let lease = Arc::new(Scripted(Mutex::new(vec![
            Err(false),
            Ok(()),
            Err(true),
            Ok(()),
        ])));
        let g = keep_alive(lease, fast(), "t".into());
        while !g.lost() {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        assert_eq!(g.renewals(), 2);
    }

    #[tokio::test]
    async fn stopping_is_not_a_lost_lease() {
        let lease = Arc::new(Scripted(Mutex::new(vec![])));
        let g = keep_alive(lease, fast(), "t".into());
        tokio::time::sleep(Duration::from_millis(20)).await;
        g.stopper().cancel();
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(!g.lost());
        assert!(g.renewals() > 0);
    }
}
