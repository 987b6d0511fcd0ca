//! What a worker did.

use std::collections::BTreeMap;

use crate::pipeline::outcome::OutcomeKind;

#[allow(unused_imports)]
use super::WorkerOptions;

/// What a worker did, by outcome label.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[must_use = "a WorkerReport says whether the worker gave up: check `gave_up` (a process should exit non-zero)"]
pub struct WorkerReport {
    /// Count per outcome label (`applied`, `duplicate`, ...).
    pub outcomes: BTreeMap<OutcomeKind, u64>,
    /// Failed receives.
    pub receive_errors: u64,
    /// Leases lost while a handler ran.
    pub leases_lost: u64,
    /// Why the worker gave up (receives kept failing with an error a retry cannot fix for
    /// [`WorkerOptions::give_up_after`]): `None` when it stopped on shutdown or when idle. A process should
    /// exit non-zero when this is set.
    pub gave_up: Option<String>,
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
}

/// `WorkerReport applied=3 duplicate=1 receive_errors=0 leases_lost=0`: every outcome seen, then the
/// worker's own counts, one line.
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
        if let Some(why) = &self.gave_up {
            write!(f, " gave_up={why:?}")?;
        }
        Ok(())
    }
}
