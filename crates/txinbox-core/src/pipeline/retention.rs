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

    /// The longest time between a message's first apply and a copy of it coming back, which markers must
    /// outlive. Without a dead-letter queue, the queue's retention: an applied message whose delete was lost
    /// can be received again until it expires. With one, a copy can wait in the queue its whole retention,
    /// then in the dead-letter queue its whole retention, then for an operator's redrive
    /// (`redrive_grace`): the sum. The dead-letter queue's time is counted from the move, as SQS does for FIFO
    /// queues ("For FIFO queues, the enqueue timestamp resets when the message is moved to a dead-letter
    /// queue"). Saturating: a retention "for ever" (`Duration::MAX`) makes the path for ever.
    ///
    /// `txinbox check-infra` compares the same sum with `inbox.retention_seconds`.
    pub fn longest_redelivery_path(
        queue_retention: Duration,
        dead_letter_retention: Option<Duration>,
        redrive_grace: Duration,
    ) -> Duration {
        match dead_letter_retention {
            None => queue_retention,
            Some(dead) => queue_retention
                .saturating_add(dead)
                .saturating_add(redrive_grace),
        }
    }

    /// Checks that markers outlive every redelivery path through a queue with a dead-letter queue
    /// ([`longest_redelivery_path`](Self::longest_redelivery_path)): the queue's retention, plus the
    /// dead-letter queue's, plus the redrive delay an operator may take.
    ///
    /// ```
    /// use std::time::Duration;
    /// use txinbox_core::RetentionPolicy;
    /// let day = Duration::from_secs(86_400);
    /// let p = RetentionPolicy::default().keep(14 * day);
    /// // 4 days in the queue + 14 in the dead-letter queue + 1 to redrive: 19 days.
    /// assert!(p.check_covers(4 * day, 14 * day, day).is_err());
    /// // 4 + 5 + 1: 10 days.
    /// assert!(p.check_covers(4 * day, 5 * day, day).is_ok());
    /// ```
    pub fn check_covers(
        &self,
        queue_retention: Duration,
        dlq_retention: Duration,
        redrive_delay: Duration,
    ) -> Result<(), String> {
        let longest =
            Self::longest_redelivery_path(queue_retention, Some(dlq_retention), redrive_delay);
        if self.keep < longest {
            return Err(format!(
                "inbox retention {}s is shorter than the longest redelivery path {}s (queue retention + dead-letter queue retention + redrive delay): a redriven or late message would look new",
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

    /// A copy can wait the queue's retention, then the dead-letter queue's (FIFO: counted again from the
    /// move), then the redrive: markers kept for the longer of the two retentions alone do not cover it.
    #[test]
    fn the_path_through_a_dead_letter_queue_is_the_sum_of_its_parts() {
        let day = Duration::from_secs(86_400);
        let p = RetentionPolicy::default().keep(14 * day);
        assert!(p.check_covers(4 * day, 14 * day, day).is_err());
        assert!(p.check_covers(7 * day, 6 * day, day).is_ok());
        assert!(p.check_covers(7 * day, 7 * day, day).is_err());
        assert_eq!(
            RetentionPolicy::longest_redelivery_path(4 * day, None, day),
            4 * day
        );
    }
}
