//! Metric names, emitted through the [`metrics`] facade. Every series carries a `consumer` label.
//!
//! Install any `metrics` recorder (Prometheus exporter, StatsD, ...) to collect them; call [`describe`] once
//! to register their descriptions.

/// Deliveries received by the inbox.
pub const RECEIVED: &str = "txinbox_received_total";
/// Deliveries applied (marker and effect committed).
pub const APPLIED: &str = "txinbox_applied_total";
/// Applied deliveries that were redeliveries (delivery count > 1): a previous attempt failed or was lost.
pub const APPLIED_AFTER_REDELIVERY: &str = "txinbox_applied_after_redelivery_total";
/// Duplicates recognised (same identity, same payload).
pub const DUPLICATES: &str = "txinbox_duplicates_total";
/// Payload collisions (same identity, another payload).
pub const PAYLOAD_COLLISIONS: &str = "txinbox_payload_collisions_total";
/// Business-key duplicates (another identity, same business action).
pub const BUSINESS_DUPLICATES: &str = "txinbox_business_duplicates_total";
/// Conflicts on the unique key with a delivery that committed while this one was in flight.
pub const CONCURRENT_CONFLICTS: &str = "txinbox_concurrent_conflicts_total";
/// Retries (rolled back and released for redelivery), by `reason`.
pub const RETRIES: &str = "txinbox_retries_total";
/// Dead-letters, by `reason`.
pub const DEAD_LETTERS: &str = "txinbox_dead_letters_total";
/// Seconds from receive to COMMIT (histogram).
pub const RECEIVE_TO_COMMIT: &str = "txinbox_receive_to_commit_seconds";
/// Settles (ack/release/dead-letter) that failed, by `op`.
pub const SETTLE_FAILURES: &str = "txinbox_settle_failures_total";
/// Leases (locks, visibility) lost while a handler ran: a renewal failed, or the lease keeper panicked (a bug in
/// the adapter's renewal; said at error) and no longer renews it.
pub const LEASE_LOST: &str = "txinbox_lease_lost_total";
/// Lease renewals that succeeded.
pub const LEASE_RENEWALS: &str = "txinbox_lease_renewals_total";
/// Deliveries refused because their age exceeds the inbox retention (their marker may have been purged).
pub const RETENTION_EXPIRED: &str = "txinbox_retention_expired_total";
/// Deliveries released because their store had no partition for their marker yet (partitioned layout), by
/// `consumer`.
pub const PARTITION_MISSING: &str = "txinbox_partition_missing_total";
/// Partitions a partitioned store's maintenance created ahead, by `table`.
pub const PARTITIONS_CREATED: &str = "txinbox_partitions_created_total";
/// Partitions a partitioned store's maintenance dropped whole, by `table`.
pub const PARTITIONS_DROPPED: &str = "txinbox_partitions_dropped_total";
/// Where the newest partition ends, as a Unix time in seconds, by `table` and each `consumer` the maintenance
/// publishes for (gauge): minus `time()`, how far ahead the partitions reach, which keeps falling if the
/// maintenance stops.
pub const PARTITIONS_END: &str = "txinbox_partitions_end_timestamp_seconds";
/// Failures caused by an unsupported contract version.
pub const CONTRACT_VERSION_FAILURES: &str = "txinbox_contract_version_failures_total";
/// Deliveries with no usable identity.
pub const UNKNOWN_IDENTITY: &str = "txinbox_unknown_identity_total";
/// Identities that fell back to the broker-assigned id.
pub const IDENTITY_BROKER_FALLBACK: &str = "txinbox_identity_broker_fallback_total";
/// Whether a shard's store answered its last probe (gauge, 1 or 0), by `consumer` and `shard`.
pub const SHARD_UP: &str = "txinbox_shard_up";
/// Deliveries released without touching their shard's store because it was unavailable, by `consumer` and
/// `shard`.
pub const SHARD_UNAVAILABLE: &str = "txinbox_shard_unavailable_total";
/// Inbox rows deleted by retention.
pub const RETENTION_PURGED: &str = "txinbox_retention_purged_total";
/// Inbox rows present after the last retention run (gauge).
pub const INBOX_ROWS: &str = "txinbox_inbox_rows";
/// Redriven deliveries an inbox received (they carry the `txinbox-redriven-from` attribute), by `consumer`.
pub const REDRIVEN: &str = "txinbox_redriven_total";
/// Deliveries interrupted before COMMIT by the shutdown deadline, or received ahead and still waiting for a slot
/// when shutdown began.
pub const INTERRUPTED: &str = "txinbox_interrupted_total";
/// Effect executions, by `consumer`, `destination` and `result` (`done`, `not_sent`, `rejected`, `in_progress`,
/// `uncertain`).
pub const EFFECT_EXECUTIONS: &str = "txinbox_effect_executions_total";
/// Effect reconciliations, by `consumer`, `destination` and `outcome` (`done`, `not_found`, `repeat`, `unknown`,
/// `not_answered`).
pub const EFFECT_RECONCILIATIONS: &str = "txinbox_effect_reconciliations_total";
/// Effects by `consumer`, `destination` and `state`: the uncertain and needs-attention ones are the pattern's
/// "external effects in uncertain state".
pub const EFFECTS: &str = "txinbox_effects";
/// Done effects without a reference from the destination, by `consumer` and `destination`: it said it did them
/// (or a confirmation found them) without an id to show for it.
pub const EFFECTS_DONE_WITHOUT_REFERENCE: &str = "txinbox_effects_done_without_reference";
/// Age in seconds of the oldest pending effect, by `consumer` and `destination` (the relay lag).
pub const EFFECT_OLDEST_PENDING: &str = "txinbox_effect_oldest_pending_seconds";

/// Rows removed by the maintenance, by `table` (`markers`, `rejections`, `effects`) and `consumer`.
pub const MAINTENANCE_REMOVED: &str = "txinbox_maintenance_removed_total";
/// Duration of a maintenance pass.
pub const MAINTENANCE_DURATION: &str = "txinbox_maintenance_duration_seconds";
/// Rows left after a maintenance pass, by `table` and `consumer`.
pub const MAINTENANCE_ROWS: &str = "txinbox_maintenance_rows";
/// Age in seconds of the oldest row left, by `table` and `consumer`.
pub const MAINTENANCE_OLDEST: &str = "txinbox_maintenance_oldest_row_seconds";
/// Background maintenance passes that failed, by `reason`: `timeout` (given up past
/// `MaintenanceOptions::pass_timeout`, a store call that did not answer) or `store_error` (stopped at a store
/// error); with `shard` on shards, no `consumer` label (a maintenance is its store's). The next pass runs as
/// usual.
pub const MAINTENANCE_FAILED: &str = "txinbox_maintenance_failed_passes_total";

/// Messages a redrive tool moved back from a dead-letter queue, by `queue` (the queue they were sent to).
pub const REDRIVE_MOVED: &str = "txinbox_redrive_moved_total";

/// Failed receives, by `consumer` and `kind` (the broker error kind: `unauthorized`, `entity_not_found`,
/// `throttled`, ...).
pub const RECEIVE_ERRORS: &str = "txinbox_receive_errors_total";

/// Deliveries a worker holds, by `consumer` and `state`: `waiting` (received ahead, waiting for a slot, with
/// `WorkerOptions::prefetch`; or in a batch lingering for the next receives, with
/// `WorkerOptions::batch_linger`) and `processing` (holding a slot: being applied or settled). `processing`
/// at the worker's concurrency all the time means the worker is saturated (gauge).
pub const WORKER_DELIVERIES: &str = "txinbox_worker_deliveries";

/// Deliveries a worker abandoned at shutdown, by `consumer`: still in flight `SHUTDOWN_GRACE` after the shutdown
/// deadline (a store or broker call that did not answer, a hand-back's release included), dropped where they waited as a SIGKILL would. They come
/// back after their lock or visibility timeout (a committed one as a duplicate); `WorkerReport::abandoned`.
pub const DELIVERIES_ABANDONED: &str = "txinbox_deliveries_abandoned_total";

/// Deliveries a worker handed back to the broker unapplied (released with no delay, so that another worker
/// receives them at once), by `consumer` and `reason`; at shutdown: `receive_in_flight` (brought by the
/// receive in flight when the worker stopped), `surplus` (brought by a receive beyond what it asked for, an
/// adapter ignoring its `max`, still waiting for a place), `waiting_for_slot` (received ahead with
/// `WorkerOptions::prefetch`, or in a lingering batch, still waiting for a slot: the processor releases them,
/// outcome `interrupted`, also counted in `txinbox_interrupted_total`). A release that failed is not counted here
/// but in `txinbox_settle_failures_total{op="release"}`, its message back after its lock or visibility timeout
/// (for `waiting_for_slot`, in both: the worker learns only the processor's outcome). Not at shutdown:
/// `processor_panicked` (left unsettled by a processor that panicked, handed back while the worker runs). Each
/// hand-back is one more receive of the message toward the queue's maximum receive count.
pub const WORKER_HANDED_BACK: &str = "txinbox_worker_handed_back_total";

/// Registers descriptions for every metric with the installed recorder.
pub fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(RECEIVED, "Deliveries received by the inbox");
    describe_counter!(APPLIED, "Deliveries applied");
    describe_counter!(
        APPLIED_AFTER_REDELIVERY,
        "Applied deliveries that were redeliveries"
    );
    describe_counter!(DUPLICATES, "Duplicates recognised");
    describe_counter!(PAYLOAD_COLLISIONS, "Same id with another payload");
    describe_counter!(BUSINESS_DUPLICATES, "Another id with the same business key");
    describe_counter!(CONCURRENT_CONFLICTS, "Conflicts with a concurrent delivery");
    describe_counter!(RETRIES, "Deliveries released for retry");
    describe_counter!(DEAD_LETTERS, "Deliveries dead-lettered");
    describe_histogram!(
        RECEIVE_TO_COMMIT,
        Unit::Seconds,
        "Receive to COMMIT latency"
    );
    describe_counter!(SETTLE_FAILURES, "Settles that failed");
    describe_counter!(LEASE_LOST, "Leases lost while a handler ran");
    describe_counter!(LEASE_RENEWALS, "Lease renewals");
    describe_counter!(
        RETENTION_EXPIRED,
        "Deliveries older than the inbox retention"
    );
    describe_counter!(
        PARTITION_MISSING,
        "Deliveries released because their marker's partition does not exist yet"
    );
    describe_counter!(
        PARTITIONS_CREATED,
        "Partitions created ahead by the maintenance"
    );
    describe_counter!(
        PARTITIONS_DROPPED,
        "Partitions dropped whole by the maintenance"
    );
    describe_gauge!(
        PARTITIONS_END,
        Unit::Seconds,
        "Where the newest partition ends (Unix time)"
    );
    describe_counter!(CONTRACT_VERSION_FAILURES, "Unsupported contract versions");
    describe_gauge!(SHARD_UP, "Whether a shard's store answered its last probe");
    describe_counter!(
        SHARD_UNAVAILABLE,
        "Deliveries released because their shard was unavailable"
    );
    describe_counter!(UNKNOWN_IDENTITY, "Deliveries without a usable identity");
    describe_counter!(
        IDENTITY_BROKER_FALLBACK,
        "Identities from the broker-assigned id"
    );
    describe_counter!(RETENTION_PURGED, "Inbox rows purged by retention");
    describe_gauge!(INBOX_ROWS, "Inbox rows after the last retention run");
    describe_counter!(REDRIVEN, "Redriven deliveries received by the inbox");
    describe_counter!(REDRIVE_MOVED, "Messages a redrive moved back from a DLQ");
    describe_counter!(RECEIVE_ERRORS, "Failed receives by error kind");
    describe_gauge!(
        WORKER_DELIVERIES,
        "Deliveries a worker holds, waiting (for a slot or in a lingering batch) or processing"
    );
    describe_counter!(
        WORKER_HANDED_BACK,
        "Deliveries a worker handed back to the broker unapplied (at shutdown, or left by a processor that panicked), by reason"
    );
    describe_counter!(
        DELIVERIES_ABANDONED,
        "Deliveries abandoned at shutdown, still in flight past the shutdown grace"
    );
    describe_counter!(
        INTERRUPTED,
        "Deliveries interrupted by shutdown before COMMIT (or prefetched, not yet begun)"
    );
    describe_counter!(EFFECT_EXECUTIONS, "External effect executions by result");
    describe_counter!(
        EFFECT_RECONCILIATIONS,
        "Reconciliations of uncertain effects by outcome"
    );
    describe_gauge!(EFFECTS, "External effects by state");
    describe_gauge!(
        EFFECTS_DONE_WITHOUT_REFERENCE,
        "Done external effects without a reference from the destination"
    );
    describe_counter!(MAINTENANCE_REMOVED, "Rows removed by the maintenance");
    describe_histogram!(
        MAINTENANCE_DURATION,
        Unit::Seconds,
        "Duration of a maintenance pass"
    );
    describe_gauge!(MAINTENANCE_ROWS, "Rows left after a maintenance pass");
    describe_counter!(
        MAINTENANCE_FAILED,
        "Maintenance passes that failed (timed out or stopped at a store error)"
    );
    describe_gauge!(
        MAINTENANCE_OLDEST,
        Unit::Seconds,
        "Age of the oldest row left after a maintenance pass"
    );
    describe_gauge!(
        EFFECT_OLDEST_PENDING,
        Unit::Seconds,
        "Age of the oldest pending effect"
    );
}
