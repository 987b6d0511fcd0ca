//! Consumer options. The defaults match the Terraform samples: lock duration PT1M, max delivery count 10,
//! duplicate detection window PT10M.

use std::time::Duration;

use crate::error::ServiceBusError;

/// The shortest lock duration the adapter accepts (Service Bus's minimum is 5 s; the emulator allows less).
pub const MIN_LOCK_DURATION: Duration = Duration::from_secs(1);
/// The shortest long-poll wait the adapter accepts: the peek-lock's `timeout` is whole seconds, and 0 is no
/// long poll (Microsoft, Peek-Lock Message: "204 No messages available within the specified timeout period.").
pub const MIN_WAIT: Duration = Duration::from_secs(1);
/// The longest lock duration Service Bus allows (5 minutes).
pub const MAX_LOCK_DURATION: Duration = Duration::from_secs(300);

/// The default of [`ServiceBusOptions::batch_size`]: a cap high enough that the worker's request (its
/// `WorkerOptions::batch_size`, `[worker] receive_max`, at most its free places) decides how many messages a
/// receive locks, yet bounds the peek-lock requests one receive sends at once (REST locks one message per request).
pub const DEFAULT_BATCH_SIZE: usize = 64;

/// What happens to a message the inbox dead-letters (payload collision, bad input, permanent handler error).
///
/// REST cannot dead-letter explicitly, so the adapter either forwards a copy or lets the
/// broker do it after MaxDeliveryCount.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum DeadLetterStrategy {
    /// Send a copy to `destination` (an application "poison" queue) with the MessageId, body, content type,
    /// system and custom properties intact and the reason in `txinbox-dlq-*` properties
    /// ([`crate::dlq`]), then complete the original. Copy first, complete second: a crash in between leaves
    /// the original to be redelivered and forwarded again (the destination's duplicate detection, if on,
    /// drops the second copy). The recommended strategy: the reason survives and nothing is retried in vain.
    Forward {
        /// The destination queue path.
        destination: String,
    },
    /// Abandon at once, every delivery, until the broker moves the message to `{queue}/$DeadLetterQueue` with
    /// `DeadLetterReason: MaxDeliveryCountExceeded` after MaxDeliveryCount deliveries. The inbox's reason is
    /// only in the logs and the `txinbox_dead_letters_total{reason}` metric (and, for collisions, the inbox's
    /// evidence rows); each delivery runs the inbox again, and a permanent handler error runs the handler again
    /// (rolled back each time). The default when no destination is configured.
    AbandonUntilMaxDelivery,
}

/// Options of a Service Bus consumer.
///
/// | option | default | note |
/// |---|---|---|
/// | [`wait`](Self::wait) | 20 s | long-poll `timeout` of a receive, whole seconds on the wire, at least 1 s |
/// | [`batch_size`](Self::batch_size) | [`DEFAULT_BATCH_SIZE`] (64) | the most deliveries one receive hands out, a cap over what the worker asks for (its `batch_size`, at most its free slots), which decides below it: one long poll, then `timeout=0` requests while messages keep coming; when the last receive came back full, all its requests at once with `timeout=0` (one round trip), then the long poll only if they all come back empty |
/// | [`lock_duration`](Self::lock_duration) | 60 s | the queue's LockDuration: the lease's duration (the worker renews every third of it) and the expiry computed after a renewal (REST renew answers none); a shorter lock granted by the broker wins |
/// | [`max_release_delay`](Self::max_release_delay) | 10 s | the retry backoff is served by holding the lock this long at most, then abandoning |
/// | [`settle_attempts`](Self::settle_attempts) | 3 | tries of a complete/abandon/renew on throttling, 5xx or a lost answer |
/// | [`dead_letter`](Self::dead_letter) | abandon until MaxDeliveryCount | see [`DeadLetterStrategy`] |
///
/// What belongs to the worker is set there: concurrency in [`txinbox_core::WorkerOptions`], the longest total
/// lock hold in [`txinbox_core::LeaseOptions::max_total`] (renewals stop after it; the message then comes back
/// and the inbox absorbs it), the delay of a retry in the inbox.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServiceBusOptions {
    /// Long-poll wait of a receive (sent as whole seconds).
    pub wait: Duration,
    /// Most deliveries one receive hands out, whatever the worker asks for.
    pub batch_size: usize,
    /// The queue's LockDuration: how long a lock lasts from a receive or a renewal.
    pub lock_duration: Duration,
    /// Longest time a release holds the lock before abandoning (the retry backoff).
    pub max_release_delay: Duration,
    /// Attempts of one settle or renewal when the failure is retryable.
    pub settle_attempts: u32,
    /// Dead-letter strategy.
    pub dead_letter: DeadLetterStrategy,
}

impl Default for ServiceBusOptions {
    fn default() -> Self {
        Self {
            wait: Duration::from_secs(20),
            batch_size: DEFAULT_BATCH_SIZE,
            lock_duration: Duration::from_secs(60),
            max_release_delay: Duration::from_secs(10),
            settle_attempts: 3,
            dead_letter: DeadLetterStrategy::AbandonUntilMaxDelivery,
        }
    }
}

impl ServiceBusOptions {
    /// Sets the long-poll wait (rounded down to whole seconds on the wire; at least [`MIN_WAIT`], checked by
    /// [`validate`](Self::validate)).
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    /// Caps how many deliveries one receive hands out (at least 1), below what the worker may ask for.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }
    /// Sets the queue's lock duration (at least 1 s, at most 5 min as Service Bus allows): the lock is
    /// renewed every third of it.
    pub fn lock_duration(mut self, d: Duration) -> Self {
        self.lock_duration = d;
        self
    }
    /// Sets the longest lock hold before an abandon.
    pub fn max_release_delay(mut self, d: Duration) -> Self {
        self.max_release_delay = d;
        self
    }
    /// Sets the attempts of a settle or renewal (at least 1).
    pub fn settle_attempts(mut self, n: u32) -> Self {
        self.settle_attempts = n.max(1);
        self
    }
    /// Forwards dead letters to `destination` ([`DeadLetterStrategy::Forward`]).
    pub fn dead_letter_to(mut self, destination: impl Into<String>) -> Self {
        self.dead_letter = DeadLetterStrategy::Forward {
            destination: destination.into(),
        };
        self
    }
    /// Sets the dead-letter strategy.
    pub fn dead_letter(mut self, s: DeadLetterStrategy) -> Self {
        self.dead_letter = s;
        self
    }

    /// The options a settings file's `[servicebus]` section describes (the same file `txinbox check-infra`
    /// checks): the lock duration (renewed every third of it) and the poison queue dead letters are forwarded
    /// to. The rest keeps the defaults.
    pub fn from_settings(s: &txinbox_core::settings::ServiceBusSettings) -> Self {
        let mut o = Self::default().lock_duration(Duration::from_secs(s.lock_duration_seconds));
        if let Some(d) = &s.dead_letter_to {
            o = o.dead_letter_to(d);
        }
        o
    }

    /// Checks that the options hang together. Called by [`ServiceBusReceiver::new`](crate::ServiceBusReceiver::new).
    pub fn validate(&self) -> Result<(), ServiceBusError> {
        let bad = |detail: String| Err(ServiceBusError::Config { detail });
        // The wait is the peek-lock's `timeout` in whole seconds: under 1 s it is `timeout=0`, no long poll,
        // and an idle worker would ask the namespace in a tight loop (every request billed).
        if self.wait < MIN_WAIT {
            return bad(format!(
                "long-poll wait {:?} is under 1 s (sent as whole seconds, it would be timeout=0: no long poll)",
                self.wait
            ));
        }
        if self.lock_duration < MIN_LOCK_DURATION || self.lock_duration > MAX_LOCK_DURATION {
            return bad(format!(
                "lock duration {:?} is outside 1 s..=5 min",
                self.lock_duration
            ));
        }
        if let DeadLetterStrategy::Forward { destination } = &self.dead_letter {
            if destination.trim_matches('/').is_empty() {
                return bad("the dead-letter destination is empty".into());
            }
            if destination
                .to_ascii_lowercase()
                .contains("$deadletterqueue")
            {
                return bad(
                    "a $DeadLetterQueue cannot be sent to; forward to an application queue".into(),
                );
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_terraform_samples() {
        let o = ServiceBusOptions::default();
        assert_eq!(o.lock_duration, Duration::from_secs(60));
        assert_eq!(o.wait, Duration::from_secs(20));
        assert_eq!(o.batch_size, DEFAULT_BATCH_SIZE);
        o.validate().unwrap();
    }

    #[test]
    fn inconsistent_options_are_refused() {
        let o = ServiceBusOptions::default().dead_letter_to("orders/$DeadLetterQueue");
        assert!(o.validate().is_err());
        for lock in [
            Duration::ZERO,
            Duration::from_millis(900),
            Duration::from_secs(301),
        ] {
            let o = ServiceBusOptions::default().lock_duration(lock);
            assert!(o.validate().is_err(), "{lock:?}");
        }
        ServiceBusOptions::default()
            .lock_duration(Duration::from_secs(2))
            .validate()
            .unwrap();
    }

    /// The wait goes out as the peek-lock's `timeout` in whole seconds, so a wait under 1 s is `timeout=0`:
    /// no long poll, an idle worker would ask the namespace in a tight loop (Microsoft, Peek-Lock Message:
    /// "204 No messages available within the specified timeout period.").
    #[test]
    fn a_wait_under_one_second_is_refused() {
        for wait in [Duration::ZERO, Duration::from_millis(999)] {
            let e = ServiceBusOptions::default()
                .wait(wait)
                .validate()
                .unwrap_err();
            assert!(
                matches!(&e, ServiceBusError::Config { detail } if detail.contains(&format!("{wait:?}"))),
                "{e}"
            );
        }
        for wait in [Duration::from_secs(1), Duration::from_secs(20)] {
            ServiceBusOptions::default().wait(wait).validate().unwrap();
        }
    }
}
