//! The lease keeper: renews a delivery's lock or visibility on a timer while its handler runs.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::broker::{Delivery, Lease};

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
    /// Whether a renewal failed, or the keeper panicked (the lock is presumed lost).
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

impl LeaseGuard {
    /// A lease that cannot be kept because the adapter's code panicked before a keeper could start (`what`:
    /// the method): counted lost at once, as a keeper that panics is, said at error with the panic's message.
    fn lost_to_panic(consumer: &str, what: &str, panic: &(dyn std::any::Any + Send)) -> Self {
        let state = Arc::new(LeaseState::default());
        state.lost.store(true, Ordering::SeqCst);
        metrics::counter!(crate::metrics::LEASE_LOST, "consumer" => consumer.to_owned())
            .increment(1);
        tracing::error!(
            consumer,
            panic = %panic_text(panic),
            "{what} panicked (a bug in the broker adapter): the lease is not renewed, lock presumed lost, a redelivery will be absorbed by the inbox"
        );
        Self {
            cancel: CancellationToken::new(),
            state,
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// The message of a caught panic (a `&str` or a `String` payload) for its log line, the secrets it may quote
/// (an endpoint's signature) masked.
pub(crate) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    let text = p
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic with no message".to_owned());
    crate::error::redact_secrets(&text)
}

/// Keeps the lease of `delivery` alive ([`keep_alive`]), if it has one. The adapter's [`Delivery::lease`] runs
/// here, in the caller's task: a panic in it is a lease counted lost (see [`keep_alive`]), not the caller's end.
pub(crate) fn keep_delivery_alive<D: Delivery>(
    delivery: &D,
    opts: &LeaseOptions,
    consumer: &str,
) -> Option<LeaseGuard> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| delivery.lease())) {
        Ok(lease) => lease.map(|l| keep_alive(l, opts.clone(), consumer.to_owned())),
        Err(p) => Some(LeaseGuard::lost_to_panic(
            consumer,
            "the delivery's lease (Delivery::lease)",
            p.as_ref(),
        )),
    }
}

/// Starts renewing `lease` by its [`Lease::duration`] every [`renewal_interval`] of it until the guard is
/// stopped or dropped, a renewal fails, or `opts.max_total` is reached (the lease is then lost once it runs out
/// with the delivery still held, counted as below). A lease of zero duration is not renewed.
/// A transient failure ([`crate::BrokerError::is_retryable`]) is retried on the next tick while the lease has not
/// expired. Each renewal call is bounded by the renewal interval and by the time left on the lease: a call that
/// does not answer by then is a transient failure retried at once while the lease has time left, and a lost lease
/// once it has none, so a broker that never answers is noticed when the lease runs out, not when (if ever) the
/// call returns. A failed renewal increments `txinbox_lease_lost_total` and logs a warning; a keeper that panics
/// (a bug in the lease's renewal) no longer renews the lease and counts it lost the same way
/// ([`LeaseGuard::lost`], `txinbox_lease_lost_total`), logged at error; so is a lease whose [`Lease::duration`]
/// panics (called here, in the caller's task: the panic does not escape into it). The delivery's outcome stays
/// correct because the inbox absorbs the redelivery that may follow.
pub fn keep_alive(lease: Arc<dyn Lease>, opts: LeaseOptions, consumer: String) -> LeaseGuard {
    let cancel = CancellationToken::new();
    let state = Arc::new(LeaseState::default());
    let (c, s) = (cancel.clone(), state.clone());
    let duration = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| lease.duration()))
    {
        Ok(d) => d,
        Err(p) => {
            return LeaseGuard::lost_to_panic(
                &consumer,
                "the lease's duration (Lease::duration)",
                p.as_ref(),
            )
        }
    };
    if duration.is_zero() {
        tracing::warn!(consumer, "the lease reports no duration; it is not renewed");
        return LeaseGuard { cancel, state };
    }
    let interval = renewal_interval(duration);
    let (c2, s2, consumer2) = (cancel.clone(), state.clone(), consumer.clone());
    let keeper = async move {
        let started = tokio::time::Instant::now();
        // The keeper's own reckoning of the expiry, on the runtime's clock: the lease lasts `duration` from the
        // receive (a little before `started`) and from the start of each renewal that succeeded (the broker
        // extends it at some point after the call starts). It bounds a renewal that does not answer and ends the
        // keeper when a lease was not renewed in time, whatever the adapter's `expires_at` says (it may not know).
        let mut held_until = started + duration;
        // After a renewal that did not answer, the tick has passed already: retry without sleeping again.
        let mut retry_now = false;
        loop {
            if !std::mem::take(&mut retry_now) {
                tokio::select! {
                    _ = c.cancelled() => return,
                    _ = tokio::time::sleep(interval) => {}
                }
            }
            if started.elapsed() + interval > opts.max_total {
                tracing::warn!(
                    consumer,
                    "lease keeper reached its maximum; the lease will expire"
                );
                // Not renewed any more: once it runs out with the delivery still held, the lease is lost (the
                // message can be received again meanwhile), counted as any other lost lease.
                tokio::select! {
                    _ = c.cancelled() => return,
                    _ = tokio::time::sleep_until(held_until) => {}
                }
                s.lost.store(true, Ordering::SeqCst);
                metrics::counter!(crate::metrics::LEASE_LOST, "consumer" => consumer.clone())
                    .increment(1);
                tracing::warn!(
                    consumer,
                    max_total_ms = opts.max_total.as_millis() as u64,
                    "the lease ran out at the keeper's maximum while the delivery was still held; lock presumed lost, a redelivery will be absorbed by the inbox"
                );
                return;
            }
            // A renewal that has not answered by the next tick, or by the end of the lease, is given up: waiting
            // longer would leave the lease unrenewed (and a lost lock unnoticed) for as long as the call hangs.
            let call_started = tokio::time::Instant::now();
            let bound = interval.min(held_until.saturating_duration_since(call_started));
            let renewed = tokio::select! {
                _ = c.cancelled() => return,
                r = tokio::time::timeout(bound, lease.renew(duration)) => r,
            };
            let (failure, retryable) = match renewed {
                Ok(Ok(until)) => {
                    held_until = call_started + duration;
                    s.renewals.fetch_add(1, Ordering::SeqCst);
                    metrics::counter!(crate::metrics::LEASE_RENEWALS, "consumer" => consumer.clone())
                        .increment(1);
                    tracing::debug!(consumer, %until, "lease renewed");
                    continue;
                }
                Ok(Err(e)) => (e.to_string(), e.is_retryable()),
                Err(_) => {
                    retry_now = true;
                    let waited = bound.as_millis();
                    (
                        format!("the broker did not answer the renewal within {waited} ms"),
                        true,
                    )
                }
            };
            if c.is_cancelled() {
                return;
            }
            // A transient failure (throttling, a lost answer, no answer in time) is retried while the lease may
            // still be ours; a lost lock, or a lease that has run out, ends the keeper.
            let still_held = tokio::time::Instant::now() < held_until
                && lease.expires_at().is_none_or(|t| t > chrono::Utc::now());
            if retryable && still_held {
                tracing::warn!(consumer, error = %failure, "lease renewal failed transiently; retrying");
                continue;
            }
            s.lost.store(true, Ordering::SeqCst);
            metrics::counter!(crate::metrics::LEASE_LOST, "consumer" => consumer.clone())
                .increment(1);
            tracing::warn!(consumer, error = %failure, "lease renewal failed; lock presumed lost, a redelivery will be absorbed by the inbox");
            return;
        }
    };
    tokio::spawn(async move {
        use futures::FutureExt;
        // A panic in the lease's code (the adapter's renewal) would end the keeper quietly: the lease would no
        // longer be renewed while the delivery is applied, and may run out, the message then received again.
        // It is a lost lease, said at error.
        if std::panic::AssertUnwindSafe(keeper)
            .catch_unwind()
            .await
            .is_err()
        {
            if c2.is_cancelled() {
                // Stopped meanwhile (the delivery is being settled): nothing is left to renew.
                tracing::error!(
                    consumer = consumer2,
                    "the lease keeper panicked after it was stopped"
                );
                return;
            }
            s2.lost.store(true, Ordering::SeqCst);
            metrics::counter!(crate::metrics::LEASE_LOST, "consumer" => consumer2.clone())
                .increment(1);
            tracing::error!(
                consumer = consumer2,
                "the lease keeper panicked (a bug in the broker adapter's renewal): the lease is no longer renewed, lock presumed lost, a redelivery will be absorbed by the inbox"
            );
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

    #[tokio::test(start_paused = true)]
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

    #[tokio::test(start_paused = true)]
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

    /// `txinbox_lease_lost_total` as the debugging recorder counted it.
    fn leases_lost(snap: &metrics_util::debugging::Snapshotter) -> u64 {
        snap.snapshot()
            .into_vec()
            .into_iter()
            .filter_map(|(k, _, _, v)| match v {
                metrics_util::debugging::DebugValue::Counter(n)
                    if k.key().name() == crate::metrics::LEASE_LOST =>
                {
                    Some(n)
                }
                _ => None,
            })
            .sum()
    }

    /// A lease whose renewal panics (a bug in an adapter).
    struct Panics;

    impl Lease for Panics {
        fn duration(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            None
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            panic!("the adapter's renewal panicked")
        }
    }

    /// A keeper that panics no longer renews its lease: it is counted lost (the guard, so the worker's report,
    /// and `txinbox_lease_lost_total`), not ended quietly.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_keeper_that_panics_counts_its_lease_lost() {
        use metrics_util::debugging::DebuggingRecorder;
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let g = keep_alive(Arc::new(Panics), fast(), "t".into());
        // The first renewal is due at 10 s (a third of 30 s); it panics.
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(g.lost(), "the lease is no longer renewed");
        assert_eq!(leases_lost(&snap), 1);
    }

    /// A lease whose duration panics (a bug in an adapter).
    struct DurationPanics;

    impl Lease for DurationPanics {
        fn duration(&self) -> Duration {
            panic!("the adapter's lease duration panicked")
        }
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            None
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            Box::pin(async { Ok(Utc::now()) })
        }
    }

    /// A lease whose duration panics cannot be renewed: it is counted lost at once (the guard, so the worker's
    /// report, and `txinbox_lease_lost_total`), as a keeper that panics is, instead of the panic escaping into
    /// the worker's receive loop (seen failing so: `keep_alive` panicked).
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_lease_whose_duration_panics_is_lost_not_a_panic() {
        use metrics_util::debugging::DebuggingRecorder;
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let g = keep_alive(Arc::new(DurationPanics), fast(), "t".into());
        assert!(g.lost(), "the lease cannot be renewed");
        assert_eq!(leases_lost(&snap), 1);
    }

    /// A 30 s lease every renewal of which succeeds.
    struct Renews;

    impl Lease for Renews {
        fn duration(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            None
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            Box::pin(async { Ok(Utc::now()) })
        }
    }

    /// A keeper that reaches `max_total` stops renewing; a lease that then runs out with its delivery still
    /// held is lost (the guard, `txinbox_lease_lost_total`), where it ran out with nothing said but a warning
    /// at the maximum (seen failing so: not lost at 81 s). One stopped before it runs out is not.
    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn a_lease_that_runs_out_at_the_keepers_maximum_is_lost_if_still_held() {
        use metrics_util::debugging::DebuggingRecorder;
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let opts = LeaseOptions::default().max_total(Duration::from_secs(60));
        let held = keep_alive(Arc::new(Renews), opts.clone(), "t".into());
        let stopped = keep_alive(Arc::new(Renews), opts, "t".into());
        // Renewed at 10, 20, 30, 40 and 50 s (a third of 30 s); at 60 s the next would pass the maximum. The
        // renewal at 50 s holds the lease until 80 s.
        tokio::time::sleep(Duration::from_secs(70)).await;
        assert_eq!((held.renewals(), held.lost()), (5, false));
        stopped.stopper().cancel();
        tokio::time::sleep(Duration::from_secs(9)).await;
        assert!(!held.lost(), "the lease has 1 s left");
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            held.lost(),
            "the lease ran out at 80 s with its delivery held"
        );
        assert!(!stopped.lost(), "stopped before it ran out");
        assert_eq!(leases_lost(&snap), 1);
    }

    /// A broker whose renewal call never answers; counts the calls.
    struct Hangs(AtomicU32);

    impl Lease for Hangs {
        fn duration(&self) -> Duration {
            Duration::from_secs(30)
        }
        fn expires_at(&self) -> Option<DateTime<Utc>> {
            None
        }
        fn renew(&self, _: Duration) -> BoxFuture<'_, Result<DateTime<Utc>, BrokerError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(std::future::pending())
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_that_never_answers_is_retried_and_the_lease_is_lost_when_it_runs_out() {
        let lease = Arc::new(Hangs(AtomicU32::new(0)));
        let g = keep_alive(lease.clone(), fast(), "t".into());
        // The first renewal starts at 10 s (a third of 30 s) and hangs.
        tokio::time::sleep(Duration::from_secs(15)).await;
        assert_eq!(lease.0.load(Ordering::SeqCst), 1);
        assert!(!g.lost(), "the lease still has 15 s left");
        // Given up at 20 s, when the next renewal was due: retried at once.
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            lease.0.load(Ordering::SeqCst),
            2,
            "retried at the next tick"
        );
        assert!(!g.lost(), "the lease still has 5 s left");
        // The lease received at 0 s runs out at 30 s with no renewal: lost then, not whenever the call returns.
        tokio::time::sleep(Duration::from_secs(6)).await;
        assert!(g.lost(), "no renewal answered within the lease");
        assert_eq!(g.renewals(), 0);
        assert_eq!(lease.0.load(Ordering::SeqCst), 2, "the keeper has ended");
    }
}
