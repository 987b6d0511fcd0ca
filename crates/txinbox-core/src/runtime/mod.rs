//! The runtime around the pipeline: the [`worker`] (receive loops, concurrency, lease renewal, graceful
//! shutdown), the [`lease`] keeper's cadence, [`health`] (liveness and readiness), and the [`maintenance`]
//! (retention purges).

pub mod health;
pub mod lease;
pub mod maintenance;
pub mod worker;
