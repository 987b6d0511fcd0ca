//! The inbox lab the `txinbox lab` command runs, and the failure windows of the pattern:
//!
//! * [`lab`]: synthetic deliveries of the CRM follow-up event through the in-memory broker into the inbox;
//! * [`windows`]: the failure windows of the pattern, each checked against inbox rows, business effects,
//!   broker state, evidence rows and metrics;
//! * [`faults`]: the simulated crashes those windows need, outside the production path;
//! * [`labdb`]: the lab's business table on each backend.
//!
//! The test suites use them too; their own support (the PostgreSQL they must have, fresh stores, metric
//! totals) is `txinbox-testkit`.

pub mod faults;
pub mod lab;
pub mod labdb;
pub mod windows;
