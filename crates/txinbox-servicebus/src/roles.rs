//! The Azure roles a worker's identity needs (Azure AD / managed identity authentication), per entity.
//!
//! | role | scope | why |
//! |---|---|---|
//! | [`DATA_RECEIVER`] `Azure Service Bus Data Receiver` | the queue the worker consumes | peek-lock receive, complete, abandon, lock renewal |
//! | [`DATA_SENDER`] `Azure Service Bus Data Sender` | the poison queue of [`DeadLetterStrategy::Forward`](crate::DeadLetterStrategy::Forward) | the copy of a dead letter is sent there before the original is completed |
//!
//! The recommended dead-letter strategy forwards to an application queue named, by convention,
//! [`poison_queue_name`] (`{queue}-poison`). With
//! [`DeadLetterStrategy::AbandonUntilMaxDelivery`](crate::DeadLetterStrategy::AbandonUntilMaxDelivery) the
//! worker needs only the receiver role. `txinbox check-infra` checks that the Terraform assigns
//! [`QUEUE_ROLES`] on the queue and [`POISON_QUEUE_ROLES`] on its poison queue to the same principal.
//!
//! ```
//! use txinbox_servicebus::roles;
//! assert_eq!(roles::poison_queue_name("crm-events"), "crm-events-poison");
//! assert_eq!(roles::QUEUE_ROLES, ["Azure Service Bus Data Receiver"]);
//! ```

/// Built-in role to receive (and settle) from a queue.
pub const DATA_RECEIVER: &str = "Azure Service Bus Data Receiver";
/// Built-in role to send to a queue.
pub const DATA_SENDER: &str = "Azure Service Bus Data Sender";

/// Roles the worker's identity needs on the queue it consumes.
pub const QUEUE_ROLES: [&str; 1] = [DATA_RECEIVER];
/// Roles the worker's identity needs on the poison queue it forwards dead letters to.
pub const POISON_QUEUE_ROLES: [&str; 1] = [DATA_SENDER];

/// Suffix of the poison queue's name by convention.
pub const POISON_QUEUE_SUFFIX: &str = "-poison";

/// The conventional poison queue of `queue`: `{queue}-poison`, the destination of
/// [`ServiceBusOptions::dead_letter_to`](crate::ServiceBusOptions::dead_letter_to) in the examples and the
/// Terraform sample.
pub fn poison_queue_name(queue: &str) -> String {
    format!("{queue}{POISON_QUEUE_SUFFIX}")
}
