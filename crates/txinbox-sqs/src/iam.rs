//! The IAM actions a worker built on [`SqsReceiver`](crate::SqsReceiver) needs, per resource.
//!
//! A worker calls these SQS operations, and no other:
//!
//! | operation | on | when | IAM action |
//! |---|---|---|---|
//! | `GetQueueAttributes` | the queue | [`SqsReceiver::connect`](crate::SqsReceiver::connect) (the `RedrivePolicy`) and the start-up check ([`Receiver::check`](txinbox_core::Receiver::check)) | `sqs:GetQueueAttributes` |
//! | `ReceiveMessage` | the queue | every receive | `sqs:ReceiveMessage` |
//! | `ChangeMessageVisibility` | the queue | the visibility heartbeat, a release with a retry delay, a held message | `sqs:ChangeMessageVisibility` |
//! | `DeleteMessage`, `DeleteMessageBatch` | the queue | the ack after COMMIT, the delete after a dead-letter forward | `sqs:DeleteMessage` |
//! | `GetQueueUrl` | the dead-letter queue | `connect`, when no DLQ URL is configured: the DLQ named by the `RedrivePolicy` ARN | `sqs:GetQueueUrl` |
//! | `GetQueueAttributes` | the dead-letter queue | the start-up check ([`Receiver::check`](txinbox_core::Receiver::check)): the DLQ exists and may be read | `sqs:GetQueueAttributes` |
//! | `SendMessage` | the dead-letter queue | an explicit dead-letter forward (payload collision, bad input, permanent error) | `sqs:SendMessage` |
//!
//! AWS (SQS Developer Guide, batch actions): "You cannot set permissions explicitly for `SendMessageBatch`,
//! `DeleteMessageBatch`, or `ChangeMessageVisibilityBatch`. Instead, setting permissions for `SendMessage`,
//! `DeleteMessage`, or `ChangeMessageVisibility` sets permissions for the corresponding batch versions of the
//! actions." So `DeleteMessageBatch` needs `sqs:DeleteMessage`.
//!
//! `txinbox check-infra` checks that the worker's IAM policy in the Terraform grants each of
//! [`QUEUE_ACTIONS`] on the queue and each of [`DLQ_ACTIONS`] on its dead-letter queue; a test runs a worker
//! against moto with every SDK call recorded and checks the recorded operations against [`action_of`].
//!
//! ```
//! use txinbox_sqs::iam;
//! assert_eq!(iam::action_of("DeleteMessageBatch"), Some("sqs:DeleteMessage"));
//! assert!(iam::DLQ_ACTIONS.contains(&"sqs:GetQueueUrl"));
//! ```

/// IAM actions the worker needs on the queue it consumes.
pub const QUEUE_ACTIONS: [&str; 4] = [
    "sqs:ReceiveMessage",
    "sqs:DeleteMessage",
    "sqs:ChangeMessageVisibility",
    "sqs:GetQueueAttributes",
];

/// IAM actions the worker needs on the queue's dead-letter queue.
pub const DLQ_ACTIONS: [&str; 3] = [
    "sqs:SendMessage",
    "sqs:GetQueueUrl",
    "sqs:GetQueueAttributes",
];

/// SQS operations (API names) the worker calls on the queue, with the IAM action that authorizes each.
pub const QUEUE_OPERATIONS: [(&str, &str); 5] = [
    ("GetQueueAttributes", "sqs:GetQueueAttributes"),
    ("ReceiveMessage", "sqs:ReceiveMessage"),
    ("ChangeMessageVisibility", "sqs:ChangeMessageVisibility"),
    ("DeleteMessage", "sqs:DeleteMessage"),
    ("DeleteMessageBatch", "sqs:DeleteMessage"),
];

/// SQS operations (API names) the worker calls on the dead-letter queue, with the IAM action that
/// authorizes each.
pub const DLQ_OPERATIONS: [(&str, &str); 3] = [
    ("GetQueueUrl", "sqs:GetQueueUrl"),
    ("GetQueueAttributes", "sqs:GetQueueAttributes"),
    ("SendMessage", "sqs:SendMessage"),
];

/// The IAM action that authorizes an SQS operation the worker calls (on either queue); `None` for an
/// operation the worker does not call.
pub fn action_of(operation: &str) -> Option<&'static str> {
    QUEUE_OPERATIONS
        .iter()
        .chain(DLQ_OPERATIONS.iter())
        .find(|(op, _)| *op == operation)
        .map(|(_, action)| *action)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_and_actions_agree() {
        let mut from_ops: Vec<&str> = QUEUE_OPERATIONS.iter().map(|(_, a)| *a).collect();
        from_ops.sort_unstable();
        from_ops.dedup();
        let mut declared = QUEUE_ACTIONS.to_vec();
        declared.sort_unstable();
        assert_eq!(from_ops, declared);
        let mut from_ops: Vec<&str> = DLQ_OPERATIONS.iter().map(|(_, a)| *a).collect();
        from_ops.sort_unstable();
        let mut declared = DLQ_ACTIONS.to_vec();
        declared.sort_unstable();
        assert_eq!(from_ops, declared);
        assert_eq!(action_of("SendMessageBatch"), None);
    }
}
