//! The CRM follow-up agent of the inbox lab: each `meeting.ended` event creates one follow-up task, once,
//! whatever the broker redelivers. Shared by the `sqs-crm-worker` and `servicebus-crm-worker` examples, which
//! only differ in the receiver they build.
//!
//! * identity: CloudEvents attributes, else the producer id; consumer name from the command line;
//! * the body is parsed once into [`MeetingEnded`]; a body that is not one is dead-lettered as `invalid_json`;
//! * business key `criar_tarefa_followup:<opportunity>:<meeting>`, computed from the typed event, so two
//!   different events asking for the same follow-up create one task;
//! * the task row and the inbox marker commit in one transaction (PostgreSQL or SQLite): one handler, written
//!   once, for both; on DynamoDB (`--store dynamodb://TABLE`) the task is an item of the inbox's table, in the
//!   marker's `TransactWriteItems`.

mod agent;
mod handler;
mod process;

pub use agent::{run, AgentOptions};
pub use handler::{
    business_key, create_tables_pg, create_task, create_task_dynamodb, crm_destination,
    MeetingEnded, CRM,
};
pub use process::{
    exit, finish, init_logging, serve_metrics, set, Abandoned, CommonArgs, GaveUp, PartsFailed,
    EXIT_ABANDONED, EXIT_CANNOT_START, EXIT_GAVE_UP, EXIT_PANICKED,
};

/// An error starting the agent.
pub type Error = Box<dyn std::error::Error + Send + Sync>;
