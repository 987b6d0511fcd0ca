//! The runtime around the pipeline: the [worker](worker) (receive loops, concurrency, lease renewal, graceful
//! shutdown), the [lease keeper](lease)'s cadence, [health](health) (liveness and readiness), and the
//! [maintenance](maintenance) (retention purges).

pub mod health;
pub mod lease;
pub mod maintenance;
pub mod worker;
