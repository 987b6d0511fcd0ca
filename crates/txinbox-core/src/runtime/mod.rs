//! The runtime around the pipeline: the [`worker`] (receive loops, concurrency, lease renewal, graceful
//! shutdown), the [`lease`] keeper's cadence, [`health`] (liveness and readiness), and the [`maintenance`]
//! (retention purges); the [`monitor`] runs them all under one shutdown; [`shards`] puts several stores
//! behind one worker.

pub mod health;
pub mod lease;
pub mod maintenance;
pub mod monitor;
pub mod shards;
pub mod worker;
