//! Retention: how long inbox markers are kept.
//!
//! Deleting a marker too early makes an old message look new. The retention must cover the longest path by
//! which a message can come back: the queue's retention, the dead-letter queue's retention, the time an
//! operator may take to redrive, and incidents. [`RetentionPolicy::check_covers`] tells when it does not.

use std::time::Duration;

/// How long markers are kept, and what happens to a delivery older than that.
#[derive(Clone, Debug)]
pub struct RetentionPolicy {
    /// How long a marker is kept after it is written (default 30 days).
    pub keep: Duration,
    /// Refuse (dead-letter with reason `retention_expired`) a delivery whose broker enqueue time is older
    /// than `keep`, because its marker may already be purged and applying it could repeat the effect
    /// (default true). When false such deliveries are processed as usual.
    pub refuse_older_than_retention: bool,
}

impl Default for RetentionPolicy {
    fn default() -> Self {
        Self {
            keep: Duration::from_secs(30 * 24 * 3600),
            refuse_older_than_retention: true,
        }
    }
}

impl RetentionPolicy {
    /// Keep markers for `keep`.
    pub fn keep(mut self, keep: Duration) -> Self {
        self.keep = keep;
        self
    }

    /// Whether to refuse deliveries older than the retention.
    pub fn refuse_older_than_retention(mut self, refuse: bool) -> Self {
        self.refuse_older_than_retention = refuse;
        self
    }

    /// Checks that markers outlive every redelivery path: the queue's retention, the DLQ's retention plus
    /// the redrive delay an operator may take.
    ///
    /// ```
    /// use std::time::Duration;
    /// use txinbox_core::RetentionPolicy;
    /// let day = Duration::from_secs(86_400);
    /// let p = RetentionPolicy::default().keep(7 * day);
    /// assert!(p.check_covers(4 * day, 30 * day, day).is_err());
    /// assert!(p.check_covers(4 * day, 5 * day, day).is_ok());
    /// ```
    pub fn check_covers(
        &self,
        queue_retention: Duration,
        dlq_retention: Duration,
        redrive_delay: Duration,
    ) -> Result<(), String> {
        // Saturating: a path "for ever" (Duration::MAX) is longer than any retention but a MAX one.
        let longest = queue_retention.max(dlq_retention.saturating_add(redrive_delay));
        if self.keep < longest {
            return Err(format!(
                "inbox retention {}s is shorter than the longest redelivery path {}s: a redriven or late message would look new",
                self.keep.as_secs(),
                longest.as_secs()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A retention "for ever" (`Duration::MAX`, or years read from a file) is compared, never overflowed.
    #[test]
    fn paths_too_long_to_add_are_compared_without_a_panic() {
        let p = RetentionPolicy::default().keep(Duration::MAX);
        assert!(p
            .check_covers(Duration::MAX, Duration::MAX, Duration::MAX)
            .is_ok());
        let day = Duration::from_secs(86_400);
        let p = RetentionPolicy::default().keep(30 * day);
        assert!(p.check_covers(day, Duration::MAX, day).is_err());
    }
}
