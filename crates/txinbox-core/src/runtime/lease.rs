//! The lease keeper: renews a delivery's lock or visibility on a timer while its handler runs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::Lease;

/// What the lease keeper cannot learn from the lease itself.
///
/// The cadence and the extension come from [`Lease::duration`]: each renewal extends the lease by its
/// duration, every [`renewal_interval`] of it (a third).
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "LeaseOptions do nothing until given to WorkerOptions::lease"]
pub struct LeaseOptions {
    /// Stop renewing after the lease has been held this long in total (default 2 h; SQS caps visibility at
    /// 12 hours from the receive).
    pub max_total: Duration,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        Self {
            max_total: Duration::from_secs(2 * 3600),
        }
    }
}

impl LeaseOptions {
    /// Sets the maximum total time a lease is kept.
    pub fn max_total(mut self, d: Duration) -> Self {
        self.max_total = d;
        self
    }
}

/// Shortest time between two renewals, whatever the lease duration.
pub const MIN_RENEWAL_INTERVAL: Duration = Duration::from_millis(1);

/// How often a lease of `duration` is renewed: a third of it (at least [`MIN_RENEWAL_INTERVAL`]), so a
/// renewal that fails transiently is retried once more before the lease runs out. A 60 s visibility timeout or
/// lock duration is renewed every 20 s.
pub fn renewal_interval(duration: Duration) -> Duration {
    (duration / 3).max(MIN_RENEWAL_INTERVAL)
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

/// Starts renewing `lease` by its [`Lease::duration`] every [`renewal_interval`] of it until the guard is
/// stopped or dropped, a renewal fails, or `opts.max_total` is reached. A lease of zero duration is not renewed. A transient failure ([`crate::BrokerError::is_retryable`]) is retried on the
/// next tick while the lease has not expired. A failed renewal increments `txinbox_lease_lost_total` and logs a warning; the
/// delivery's outcome stays correct because the inbox absorbs the redelivery that may follow.
pub fn keep_alive(lease: Arc<dyn Lease>, opts: LeaseOptions, consumer: String) -> LeaseGuard {
    let cancel = CancellationToken::new();
    let state = Arc::new(LeaseState::default());
    let (c, s) = (cancel.clone(), state.clone());
    let duration = lease.duration();
    if duration.is_zero() {
        tracing::warn!(consumer, "the lease reports no duration; it is not renewed");
        return LeaseGuard { cancel, state };
    }
    let interval = renewal_interval(duration);
    tokio::spawn(async move {
        let started = tokio::time::Instant::now();
        loop {
            tokio::select! {
                _ = c.cancelled() => return,
                _ = tokio::time::sleep(interval) => {}
            }
            if started.elapsed() + interval > opts.max_total {
                tracing::warn!(
                    consumer,
                    "lease keeper reached its maximum; the lease will expire"
                );
                return;
            }
            let renewed = tokio::select! {
                _ = c.cancelled() => return,
                r = lease.renew(duration) => r,
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
    use crate::error::{BrokerError, BrokerErrorKind};
    use chrono::{DateTime, Utc};
    use futures::future::BoxFuture;
    use std::sync::Mutex;

    /// Answers renewals from a script: Ok, a transient error, or a lost lock.
    struct Scripted(Mutex<Vec<Result<(), bool>>>);

    impl Lease for Scripted {
        fn duration(&self) -> Duration {
            Duration::from_millis(6)
        }
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            Some(Utc::now() + chrono::Duration::seconds(60))
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            let next = self.0.lock().unwrap().pop().unwrap_or(Ok(()));
            Box::pin(async move {
                match next {
                    Ok(()) => Ok(Utc::now()),
                    Err(true) => Err(BrokerError::new(BrokerErrorKind::Throttled, "renew", "429")),
                    Err(false) => Err(BrokerError::new(BrokerErrorKind::LockLost, "renew", "404")),
                }
            })
        }
    }

    fn fast() -> LeaseOptions {
        LeaseOptions::default()
    }

    #[test]
    fn the_cadence_is_a_third_of_the_duration() {
        assert_eq!(
            renewal_interval(Duration::from_secs(60)),
            Duration::from_secs(20)
        );
        assert_eq!(renewal_interval(Duration::ZERO), MIN_RENEWAL_INTERVAL);
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
        // Until the keeper has renewed at least once (a loaded machine may take longer than a few ticks).
        while g.renewals() == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        g.stopper().cancel();
        let renewed = g.renewals();
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!g.lost());
        // Stopped: at most the renewal that was under way when it stopped.
        assert!(
            g.renewals() <= renewed + 1,
            "{} after {renewed}",
            g.renewals()
        );
    }
}
