//! What a worker did.

use std::collections::BTreeMap;

use crate::pipeline::outcome::OutcomeKind;

#[allow(unused_imports)]
use super::WorkerOptions;

/// What a worker did, by outcome label. More counts may come: build one with `default()` and
/// [`merge`](Self::merge) several.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
#[must_use = "a WorkerReport says whether the worker gave up: check `gave_up` (a process should exit non-zero)"]
pub struct WorkerReport {
    /// Count per outcome label (`applied`, `duplicate`, ...).
    pub outcomes: BTreeMap<OutcomeKind, u64>,
    /// Failed receives.
    pub receive_errors: u64,
    /// Leases lost while a handler ran (a renewal failed, or the lease keeper panicked).
    pub leases_lost: u64,
    /// Deliveries handed back to the broker unapplied (released with no delay, their releases answered), as
    /// `txinbox_worker_handed_back_total` counts them. At shutdown: what the receive in flight at the stop
    /// brought and a receive's surplus still waiting for places (neither has an outcome in
    /// [`outcomes`](Self::outcomes)), and the prefetched or lingering deliveries still waiting for a slot (also
    /// in `outcomes` as `interrupted`). While running: the deliveries a processor that panicked had not settled
    /// (also in `outcomes` as `retry`).
    pub handed_back: u64,
    /// Why the worker gave up (receives kept failing with an error a retry cannot fix for
    /// [`WorkerOptions::give_up_after`]): `None` when it stopped on shutdown or when idle. A process should
    /// exit non-zero when this is set.
    pub gave_up: Option<String>,
    /// Deliveries still in flight [`SHUTDOWN_GRACE`](super::SHUTDOWN_GRACE) after the shutdown deadline (a store
    /// or broker call that did not answer): the worker stopped waiting for them and returned, as a SIGKILL
    /// would have. They have no outcome in [`outcomes`](Self::outcomes): one that had not committed is rolled
    /// back by its database when its connection closes (the process exiting) and comes back after its lock or
    /// visibility timeout; one that had committed comes back the same way and is found as a duplicate; one the
    /// worker was handing back unapplied (brought by the receive in flight at the stop, or a receive's surplus)
    /// comes back after its lock or visibility timeout. Zero
    /// when everything in flight answered. Also counted in `txinbox_deliveries_abandoned_total`; when it is not
    /// zero, [`MonitorReport::ok`](crate::MonitorReport::ok) is `false`.
    pub abandoned: u64,
}

/// A worker's report while it runs, with the deliveries handed to processors and not yet counted.
#[derive(Debug, Default)]
pub(super) struct Tally {
    pub(super) report: WorkerReport,
    /// Deliveries in the processing tasks (waiting for a slot, applied or settled), not yet in `outcomes`, and
    /// those being handed back unapplied (never in `outcomes`).
    pub(super) in_flight: u64,
    /// Set when the worker abandons what is in flight: a task ending after that records nothing, its
    /// deliveries already counted in `abandoned`.
    pub(super) closed: bool,
}

impl Tally {
    /// Abandons what is in flight: counted in `abandoned`, never in `outcomes`. Returns how many it abandoned
    /// now.
    pub(super) fn abandon(&mut self) -> u64 {
        self.closed = true;
        let now = std::mem::take(&mut self.in_flight);
        self.report.abandoned += now;
        now
    }
}

impl WorkerReport {
    /// Count for one outcome label.
    pub fn count(&self, kind: OutcomeKind) -> u64 {
        self.outcomes.get(&kind).copied().unwrap_or(0)
    }
    /// Total deliveries processed.
    pub fn total(&self) -> u64 {
        self.outcomes.values().sum()
    }

    /// Adds `other`'s counts to these (several workers' reports into one); the first reason to give up is
    /// kept.
    pub fn merge(&mut self, other: WorkerReport) {
        let WorkerReport {
            outcomes,
            receive_errors,
            leases_lost,
            handed_back,
            gave_up,
            abandoned,
        } = other;
        for (kind, n) in outcomes {
            *self.outcomes.entry(kind).or_default() += n;
        }
        self.receive_errors += receive_errors;
        self.leases_lost += leases_lost;
        self.handed_back += handed_back;
        self.abandoned += abandoned;
        if self.gave_up.is_none() {
            self.gave_up = gave_up;
        }
    }
}

/// `WorkerReport applied=3 duplicate=1 receive_errors=0 leases_lost=0`: every outcome seen, then the
/// worker's own counts, one line; ` handed_back=N`, ` abandoned=N` and ` gave_up="..."` follow when they are
/// set.
impl std::fmt::Display for WorkerReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("WorkerReport")?;
        for (kind, n) in &self.outcomes {
            write!(f, " {kind}={n}")?;
        }
        write!(
            f,
            " receive_errors={} leases_lost={}",
            self.receive_errors, self.leases_lost
        )?;
        if self.handed_back > 0 {
            write!(f, " handed_back={}", self.handed_back)?;
        }
        if self.abandoned > 0 {
            write!(f, " abandoned={}", self.abandoned)?;
        }
        if let Some(why) = &self.gave_up {
            write!(f, " gave_up={why:?}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every count of a merged report is the sum of its parts' (a field added to the report and left out of
    /// `merge` fails to compile there: it is destructured whole).
    #[test]
    fn a_merged_report_sums_every_count() {
        let mut a = WorkerReport::default();
        a.outcomes.insert(OutcomeKind::Applied, 2);
        a.receive_errors = 1;
        a.abandoned = 1;
        let mut b = WorkerReport::default();
        b.outcomes.insert(OutcomeKind::Applied, 3);
        b.outcomes.insert(OutcomeKind::Duplicate, 1);
        b.leases_lost = 2;
        b.handed_back = 4;
        b.abandoned = 5;
        b.gave_up = Some("unauthorized".into());
        a.merge(b);
        assert_eq!(a.count(OutcomeKind::Applied), 5);
        assert_eq!(a.count(OutcomeKind::Duplicate), 1);
        assert_eq!(
            (a.receive_errors, a.leases_lost, a.handed_back, a.abandoned),
            (1, 2, 4, 6)
        );
        assert_eq!(a.gave_up.as_deref(), Some("unauthorized"));
    }
}
