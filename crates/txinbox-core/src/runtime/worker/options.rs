//! The worker's options.

use std::time::Duration;

use crate::runtime::lease::LeaseOptions;

/// The largest [`WorkerOptions::batch_commit`]: PostgreSQL keeps up to 64 subtransactions of a transaction in
/// shared memory; past that, every other session's snapshot pays for it.
pub const MAX_BATCH_COMMIT: usize = 64;

/// The longest [`WorkerOptions::batch_linger`]: past a second, a larger receive
/// ([`WorkerOptions::batch_size`]) gathers a batch better than waiting does.
pub const MAX_BATCH_LINGER: Duration = Duration::from_secs(1);

/// The most [`WorkerOptions::receive_loops`].
pub const MAX_RECEIVE_LOOPS: usize = 16;

/// How long past the shutdown deadline ([`WorkerOptions::shutdown_timeout`] after the stop signal) the worker
/// waits for the rollbacks and settles the deadline asked for, and for the hand-back of what a last receive
/// brought: 5 s. Then it abandons whatever has not answered (a hung database connection or broker call) and
/// returns, counting those deliveries in [`WorkerReport::abandoned`](super::WorkerReport::abandoned). A worker
/// therefore returns at the latest `shutdown_timeout + SHUTDOWN_GRACE` after the stop signal.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// How a [`Worker`](super::Worker) runs. The fields are private: every value goes through a setter, which keeps
/// it in range (documented on each), so a worker never runs with settings it cannot honour
/// (`concurrency(0)` is 1). The `get_*` methods read the values back.
#[derive(Clone, Debug)]
#[must_use = "WorkerOptions do nothing until given to a Worker"]
pub struct WorkerOptions {
    /// Deliveries processed at once (default 8).
    pub(crate) concurrency: usize,
    /// Most deliveries asked for in one receive (default 10, the SQS maximum).
    pub(crate) batch_size: usize,
    /// How long the worker may take to stop, counted from the stop signal (default 20 s). See
    /// [`WorkerOptions::shutdown_timeout`].
    pub(crate) shutdown_timeout: Duration,
    /// What the lease keeper cannot learn from a lease (the maximum total hold). The cadence and the
    /// extension come from each delivery's [`Lease::duration`](crate::Lease::duration): renewed every third of
    /// it, so the defaults fit any visibility timeout or lock duration.
    pub(crate) lease: LeaseOptions,
    /// Pause after a failed receive (default 1 s).
    pub(crate) receive_error_backoff: Duration,
    /// Deliveries received ahead of a free slot, at most (default 0: a receive asks only for free slots). See
    /// [`WorkerOptions::prefetch`].
    pub(crate) prefetch: usize,
    /// Receive loops, each with one receive in flight at a time (default `None`: enough for every place out
    /// of the queue to be in a receive at once). See [`WorkerOptions::receive_loops`].
    pub(crate) receive_loops: Option<usize>,
    /// Most deliveries of one receive applied in one database transaction (default 1: one transaction per
    /// delivery). See [`WorkerOptions::batch_commit`].
    pub(crate) batch_commit: usize,
    /// How long a batch that is not full waits for the following receives to fill it (default zero: a batch
    /// is what one receive brought). See [`WorkerOptions::batch_linger`].
    pub(crate) batch_linger: Duration,
    /// Longest pause between failed receives: the pause doubles from
    /// [`receive_error_backoff`](Self::receive_error_backoff) up to this (default 30 s).
    pub(crate) receive_error_backoff_max: Duration,
    /// How long receives may keep failing with an error a retry cannot fix (unauthorized, entity not found,
    /// configuration) before the worker stops and reports it in [`WorkerReport::gave_up`] (default 5 min;
    /// `None`: never give up).
    pub(crate) give_up_after: Option<Duration>,
    /// How long a receive (long poll) still in flight at shutdown is waited for, so that what it brings is
    /// handed back at once (default `None`: until it ends, at most the adapter's long-poll wait and never past
    /// the shutdown deadline, [`shutdown_timeout`](Self::shutdown_timeout) after the signal). An idle worker
    /// therefore takes up to the long-poll wait (20 s by default) to stop. `Some(Duration::ZERO)` stops at once and drops the poll:
    /// messages the broker hands to it then wait for their visibility timeout or lock.
    pub(crate) shutdown_receive_wait: Option<Duration>,
    /// How long a delivery its processor panicked on waits before it can be received again, from its second
    /// delivery on (default 1 s, doubling). See [`WorkerOptions::panic_backoff`].
    pub(crate) panic_backoff: Duration,
    /// The longest such wait (default 60 s).
    pub(crate) panic_backoff_max: Duration,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            concurrency: 8,
            batch_size: 10,
            shutdown_timeout: Duration::from_secs(20),
            lease: LeaseOptions::default(),
            receive_error_backoff: Duration::from_secs(1),
            prefetch: 0,
            receive_loops: None,
            batch_commit: 1,
            batch_linger: Duration::ZERO,
            receive_error_backoff_max: Duration::from_secs(30),
            give_up_after: Some(Duration::from_secs(300)),
            shutdown_receive_wait: None,
            panic_backoff: Duration::from_secs(1),
            panic_backoff_max: Duration::from_secs(60),
        }
    }
}

impl WorkerOptions {
    /// Sets the concurrency (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n.max(1);
        self
    }
    /// Sets the receive batch size (at least 1).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }
    /// Sets how long the worker may take to stop, counted from the stop signal (the shutdown future resolving,
    /// or the worker giving up on receives): the long poll in flight is let finish and the in-flight
    /// deliveries commit and settle within it. At its end a delivery that has not committed rolls back and is
    /// released (outcome `interrupted`, received again later, never acknowledged), a long poll still running is
    /// dropped, and the worker returns once the last rollbacks and settles have answered (a delivery that
    /// committed is settled then), at most [`SHUTDOWN_GRACE`] (5 s) later: what has still not answered is
    /// abandoned, as a SIGKILL would abandon it, and counted in
    /// [`WorkerReport::abandoned`](super::WorkerReport::abandoned). Set it at least [`SHUTDOWN_GRACE`] under the
    /// grace period your orchestrator gives before it kills the process (Kubernetes:
    /// `terminationGracePeriodSeconds`, and ECS's `stopTimeout`, 30 s by default: a `shutdown_timeout` of 25 s
    /// or less; the default, 20 s, leaves the process 5 s more to report and exit).
    pub fn shutdown_timeout(mut self, d: Duration) -> Self {
        self.shutdown_timeout = d;
        self
    }
    /// Sets the lease options.
    pub fn lease(mut self, lease: LeaseOptions) -> Self {
        self.lease = lease;
        self
    }
    /// Sets the first pause after a failed receive (it doubles up to
    /// [`receive_error_backoff_max`](Self::receive_error_backoff_max) while receives keep failing).
    pub fn receive_error_backoff(mut self, d: Duration) -> Self {
        self.receive_error_backoff = d;
        self
    }
    /// Applies up to `n` deliveries of one receive in one database transaction (1 to 64; 1, the default,
    /// turns batching off): every marker in one statement, then the handlers; when a handler fails, that
    /// delivery keeps its failure and the others are applied again, each under its own savepoint. Each
    /// delivery still gets the outcome it would get alone; all are settled after the one COMMIT. Fewer commits
    /// (one WAL flush for the batch) against a longer transaction: see the crate's `docs/batching.md` for the
    /// trade-off.
    pub fn batch_commit(mut self, n: usize) -> Self {
        self.batch_commit = n.clamp(1, MAX_BATCH_COMMIT);
        self
    }
    /// With [`batch_commit`](Self::batch_commit) above 1, lets a batch that one receive did not fill wait up to
    /// `d` (from its first delivery's arrival) for the following receives to fill it, at most
    /// [`MAX_BATCH_LINGER`] (default zero: a batch is what one receive brought). Worth it when messages
    /// arrive a few at a time: fewer, larger transactions for up to `d` more latency per message. The
    /// deliveries' leases are kept alive while they wait; a receive still waiting (long poll) when the linger
    /// ends is not cut short (what it brings goes to the next batch); at shutdown a waiting batch is processed
    /// at once (with [`prefetch`](Self::prefetch), handed back instead when no slot is free, as a prefetched
    /// delivery is).
    pub fn batch_linger(mut self, d: Duration) -> Self {
        self.batch_linger = d.min(MAX_BATCH_LINGER);
        self
    }
    /// Receives up to `n` deliveries ahead of a free slot (default 0). They wait for a slot with their leases
    /// kept alive, so a slot freed by a settle does not wait a receive round trip for its next delivery; up to
    /// `concurrency + n` messages are then out of the queue at once (invisible or locked), at most
    /// `concurrency` being applied or settled. Worth it when the broker's round trip is long beside the work
    /// (see the crate's `docs/batching.md`); a prefetched message waits longer before it is applied, so keep
    /// `n` well under what the lease allows (a lease is renewed while it waits, up to
    /// [`LeaseOptions::max_total`]).
    pub fn prefetch(mut self, n: usize) -> Self {
        self.prefetch = n;
        self
    }
    /// Runs `n` receive loops (at least 1, at most [`MAX_RECEIVE_LOOPS`]), each with one receive in flight at
    /// a time, sharing the worker's places out of the queue (`concurrency + prefetch`) and its slots: when the
    /// broker is far away, one loop waits a round trip per receive while slots sit free, and several fill them
    /// sooner without taking more messages out of the queue. The further loops receive through
    /// [`Receiver::fork`](crate::Receiver::fork); a receiver that cannot fork runs one loop (logged).
    ///
    /// By default the worker chooses: enough loops for every place out of the queue to be in a receive at
    /// once, `ceil((concurrency + prefetch) / batch_size)` (4 for a concurrency of 32 and receives of 10), so
    /// the broker's round trip never leaves a slot idle waiting for the next receive.
    pub fn receive_loops(mut self, n: usize) -> Self {
        self.receive_loops = Some(n.clamp(1, MAX_RECEIVE_LOOPS));
        self
    }
    /// Sets the longest pause between failed receives (at least the first pause). It may be longer than the
    /// health's [`live_timeout`](crate::runtime::health::Health::live_timeout): a worker backing off is live
    /// through its pause (and the live timeout after it), only not ready.
    pub fn receive_error_backoff_max(mut self, d: Duration) -> Self {
        self.receive_error_backoff_max = d;
        self
    }
    /// Sets how long receives may keep failing with an error a retry cannot fix before the worker gives up
    /// (`None`: never).
    pub fn give_up_after(mut self, d: Option<Duration>) -> Self {
        self.give_up_after = d;
        self
    }
    /// Sets how long a receive in flight at shutdown is waited for (`None`: until it ends, never past the
    /// shutdown deadline; zero: dropped at once).
    pub fn shutdown_receive_wait(mut self, d: Option<Duration>) -> Self {
        self.shutdown_receive_wait = d;
        self
    }
    /// Sets how long a delivery its processor panicked on (a bug in a [`Processor`](super::Processor) of
    /// one's own, outside the inbox's containment) waits before the broker hands it out again. Its first
    /// delivery is handed back at once (a panic may be a one-off); from its second delivery on it is released
    /// after `first`, doubling with each further delivery up to `max` (defaults 1 s and 60 s: 0, 1, 2, 4 ... 60
    /// s). A message that panics every time therefore does not come straight back into the same panic, over
    /// and over, for as long as the queue keeps it (an SQS queue without a redrive policy keeps it until its
    /// retention ends). The count is the broker's (`ApproximateReceiveCount` on SQS, `DeliveryCount` on Service
    /// Bus), so the wait grows across workers and restarts. On Service Bus over REST a release with a delay holds
    /// the lock for the delay, at most the adapter's `max_release_delay`, then abandons, with the worker slot
    /// kept meanwhile. A `max` below `first` is `first`; a `first` of zero hands every such delivery back at
    /// once.
    pub fn panic_backoff(mut self, first: Duration, max: Duration) -> Self {
        self.panic_backoff = first;
        self.panic_backoff_max = max.max(first);
        self
    }
    /// Deliveries processed at once.
    pub fn get_concurrency(&self) -> usize {
        self.concurrency
    }
    /// Most deliveries asked for in one receive.
    pub fn get_batch_size(&self) -> usize {
        self.batch_size
    }
    /// How long the worker may take to stop, counted from the stop signal.
    pub fn get_shutdown_timeout(&self) -> Duration {
        self.shutdown_timeout
    }
    /// The lease keeper's options.
    pub fn get_lease(&self) -> &LeaseOptions {
        &self.lease
    }
    /// Deliveries received ahead of a free slot, at most.
    pub fn get_prefetch(&self) -> usize {
        self.prefetch
    }
    /// The receive loops the worker runs: the number set, or the one it chooses (see
    /// [`receive_loops`](Self::receive_loops)).
    pub fn get_receive_loops(&self) -> usize {
        self.receive_loops.unwrap_or_else(|| {
            self.concurrency
                .saturating_add(self.prefetch)
                .div_ceil(self.batch_size.max(1))
                .clamp(1, MAX_RECEIVE_LOOPS)
        })
    }
    /// Most deliveries of one receive applied in one transaction.
    pub fn get_batch_commit(&self) -> usize {
        self.batch_commit
    }
    /// How long a batch not full waits for the following receives.
    pub fn get_batch_linger(&self) -> Duration {
        self.batch_linger
    }
    /// The first pause after a failed receive.
    pub fn get_receive_error_backoff(&self) -> Duration {
        self.receive_error_backoff
    }
    /// The longest pause between failed receives.
    pub fn get_receive_error_backoff_max(&self) -> Duration {
        self.receive_error_backoff_max
    }
    /// How long receives may fail with an error a retry cannot fix before the worker gives up.
    pub fn get_give_up_after(&self) -> Option<Duration> {
        self.give_up_after
    }
    /// How long a receive in flight at shutdown is waited for.
    pub fn get_shutdown_receive_wait(&self) -> Option<Duration> {
        self.shutdown_receive_wait
    }
    /// The first wait of a delivery handed back after a panic (its second delivery's).
    pub fn get_panic_backoff(&self) -> Duration {
        self.panic_backoff
    }
    /// The longest wait of a delivery handed back after a panic.
    pub fn get_panic_backoff_max(&self) -> Duration {
        self.panic_backoff_max
    }

    /// How long the `delivery_count`-th delivery (1 = the first; 0, a broker that does not count, is taken
    /// for the first) of a message its processor panicked on waits before it can be received again: none for
    /// the first, then [`panic_backoff`](Self::panic_backoff) doubling up to its maximum, as the pause after
    /// failed receives doubles ([`receive_backoff`](super::receive_backoff), without its jitter).
    pub(crate) fn panic_release_delay(&self, delivery_count: u32) -> Duration {
        match delivery_count {
            0 | 1 => Duration::ZERO,
            n => super::receive_backoff(self.panic_backoff, self.panic_backoff_max, n - 1, 1.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A worker stopped with the defaults returns, and its process has time to report and exit, before the
    /// grace Kubernetes (`terminationGracePeriodSeconds`) and ECS (`stopTimeout`) give by default, 30 s, ends
    /// in a SIGKILL.
    #[test]
    fn the_default_stop_ends_within_the_orchestrators_default_grace() {
        let stop = WorkerOptions::default().get_shutdown_timeout() + SHUTDOWN_GRACE;
        assert!(
            stop + Duration::from_secs(5) <= Duration::from_secs(30),
            "{stop:?}"
        );
    }
}
