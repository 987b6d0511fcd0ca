//! Rules, violations and the report.

use std::fmt;
use std::path::PathBuf;

/// A value quoted from a pull request's Terraform, plan or variables file, as a line of the text report writes it:
/// its control characters and bidirectional overrides escaped, so it can neither rewrite a CI log's line (an
/// ESC sequence, a carriage return) nor forge one (a line break before a fake `check-infra: ok`).
pub(crate) use txinbox_core::error::escape_untrusted as escaped;

/// A rule the queue configuration must satisfy for the inbox's guarantees to hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum RuleId {
    /// `sqs-fifo-missing-redrive`: a FIFO queue (that is not itself a
    /// dead-letter queue) needs a redrive policy naming a FIFO dead-letter
    /// queue and a `maxReceiveCount`.
    SqsFifoMissingRedrive,
    /// `sqs-content-based-deduplication`: content-based deduplication is on
    /// although the producers send explicit deduplication ids.
    SqsContentBasedDeduplication,
    /// `sqs-visibility-timeout-too-short`: the visibility timeout is shorter
    /// than 2 × the worker's heartbeat interval.
    SqsVisibilityTimeoutTooShort,
    /// `sqs-retention-exceeds-inbox`: the longest redelivery path (the queue's
    /// retention, then its dead-letter queue's, then the operator's redrive
    /// grace) is longer than the inbox keeps its markers.
    SqsRetentionExceedsInbox,
    /// `sqs-identity-lost-on-dlq-move`: the settings say the identity is the
    /// deduplication id (`sqs.identity = "deduplication-id"`) on a FIFO queue
    /// with a dead-letter queue; AWS replaces that id on the move to the DLQ.
    SqsIdentityLostOnDlqMove,
    /// `sqs-worker-policy-missing-action`: an IAM policy that lets a worker
    /// receive from a queue does not grant every action the adapter calls on
    /// the queue and on its dead-letter queue.
    SqsWorkerPolicyMissingAction,
    /// `servicebus-duplicate-detection-off`: a Service Bus queue without
    /// duplicate detection.
    ServiceBusDuplicateDetectionOff,
    /// `servicebus-duplicate-window-default`: duplicate detection is on but its
    /// window is not set explicitly (or is not a valid ISO 8601 duration).
    ServiceBusDuplicateWindowDefault,
    /// `servicebus-lock-duration-too-short`: the lock duration is shorter than
    /// 2 × the worker's lock renewal interval.
    ServiceBusLockDurationTooShort,
    /// `servicebus-no-dead-lettering-on-expiry`: expired messages are dropped
    /// instead of dead-lettered.
    ServiceBusNoDeadLetteringOnExpiry,
    /// `servicebus-ttl-exceeds-inbox`: the default message time to live is
    /// unset (Service Bus then keeps messages practically forever) or longer
    /// than the inbox retention.
    ServiceBusTtlExceedsInbox,
    /// `servicebus-retention-path-exceeds-inbox`: the queue's time to live,
    /// then its poison queue's, then the operator's redrive grace, is longer
    /// than the inbox keeps its markers.
    ServiceBusRetentionPathExceedsInbox,
    /// `servicebus-worker-role-missing`: the identity that receives from a
    /// queue lacks a role the adapter needs (Data Sender on the poison queue
    /// dead letters are forwarded to), or that poison queue is not declared.
    ServiceBusWorkerRoleMissing,
    /// `dynamodb-inbox-table-missing`: the settings' store is `dynamodb://TABLE` but no
    /// `aws_dynamodb_table` of that name is declared.
    DynamoDbInboxTableMissing,
    /// `dynamodb-key-schema`: the inbox table's key is not the store's (hash key `pk` of type `S`, no
    /// range key).
    DynamoDbKeySchema,
    /// `dynamodb-index-mismatch`: an index the store queries (`by_consumer`, `due`) is missing or has
    /// other keys or another projection.
    DynamoDbIndexMismatch,
    /// `dynamodb-ttl-off`: time to live is not enabled on `expires_at`, so expired markers are never
    /// deleted.
    DynamoDbTtlOff,
    /// `dynamodb-pitr-off`: point-in-time recovery is off.
    DynamoDbPitrOff,
    /// `dynamodb-encryption-off`: the table is not encrypted with a KMS key.
    DynamoDbEncryptionOff,
    /// `dynamodb-worker-policy-missing-action`: an IAM policy that lets a worker write the inbox table
    /// does not grant every action the store calls on it and on its indexes.
    DynamoDbWorkerPolicyMissingAction,
    /// `dynamodb-worker-policy-too-broad`: a worker's IAM policy grants DynamoDB actions on the inbox
    /// table beyond the store's (`dynamodb:*`, `Scan`, `BatchWriteItem`, `UpdateTable`, ...).
    DynamoDbWorkerPolicyTooBroad,
}

impl RuleId {
    /// Every rule, in the order the checker reports them.
    pub const ALL: [RuleId; 21] = [
        RuleId::SqsFifoMissingRedrive,
        RuleId::SqsContentBasedDeduplication,
        RuleId::SqsVisibilityTimeoutTooShort,
        RuleId::SqsRetentionExceedsInbox,
        RuleId::SqsIdentityLostOnDlqMove,
        RuleId::SqsWorkerPolicyMissingAction,
        RuleId::ServiceBusDuplicateDetectionOff,
        RuleId::ServiceBusDuplicateWindowDefault,
        RuleId::ServiceBusLockDurationTooShort,
        RuleId::ServiceBusNoDeadLetteringOnExpiry,
        RuleId::ServiceBusTtlExceedsInbox,
        RuleId::ServiceBusRetentionPathExceedsInbox,
        RuleId::ServiceBusWorkerRoleMissing,
        RuleId::DynamoDbInboxTableMissing,
        RuleId::DynamoDbKeySchema,
        RuleId::DynamoDbIndexMismatch,
        RuleId::DynamoDbTtlOff,
        RuleId::DynamoDbPitrOff,
        RuleId::DynamoDbEncryptionOff,
        RuleId::DynamoDbWorkerPolicyMissingAction,
        RuleId::DynamoDbWorkerPolicyTooBroad,
    ];

    /// The rule's stable id, as printed in reports.
    pub const fn as_str(self) -> &'static str {
        match self {
            RuleId::SqsFifoMissingRedrive => "sqs-fifo-missing-redrive",
            RuleId::SqsContentBasedDeduplication => "sqs-content-based-deduplication",
            RuleId::SqsVisibilityTimeoutTooShort => "sqs-visibility-timeout-too-short",
            RuleId::SqsRetentionExceedsInbox => "sqs-retention-exceeds-inbox",
            RuleId::SqsIdentityLostOnDlqMove => "sqs-identity-lost-on-dlq-move",
            RuleId::SqsWorkerPolicyMissingAction => "sqs-worker-policy-missing-action",
            RuleId::ServiceBusDuplicateDetectionOff => "servicebus-duplicate-detection-off",
            RuleId::ServiceBusDuplicateWindowDefault => "servicebus-duplicate-window-default",
            RuleId::ServiceBusLockDurationTooShort => "servicebus-lock-duration-too-short",
            RuleId::ServiceBusNoDeadLetteringOnExpiry => "servicebus-no-dead-lettering-on-expiry",
            RuleId::ServiceBusTtlExceedsInbox => "servicebus-ttl-exceeds-inbox",
            RuleId::ServiceBusRetentionPathExceedsInbox => {
                "servicebus-retention-path-exceeds-inbox"
            }
            RuleId::ServiceBusWorkerRoleMissing => "servicebus-worker-role-missing",
            RuleId::DynamoDbInboxTableMissing => "dynamodb-inbox-table-missing",
            RuleId::DynamoDbKeySchema => "dynamodb-key-schema",
            RuleId::DynamoDbIndexMismatch => "dynamodb-index-mismatch",
            RuleId::DynamoDbTtlOff => "dynamodb-ttl-off",
            RuleId::DynamoDbPitrOff => "dynamodb-pitr-off",
            RuleId::DynamoDbEncryptionOff => "dynamodb-encryption-off",
            RuleId::DynamoDbWorkerPolicyMissingAction => "dynamodb-worker-policy-missing-action",
            RuleId::DynamoDbWorkerPolicyTooBroad => "dynamodb-worker-policy-too-broad",
        }
    }
}

impl fmt::Display for RuleId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One setting that breaks a guarantee, with where it is.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Violation {
    /// The rule that is broken.
    pub rule: RuleId,
    /// The `.tf` file (the checked directory joined with the file name).
    pub file: PathBuf,
    /// 1-based line: the offending attribute's line, or the resource block's
    /// first line when the attribute is missing.
    pub line: usize,
    /// The resource address, e.g. `aws_sqs_queue.main`.
    pub resource: String,
    /// What is wrong and why it breaks the inbox's guarantee.
    pub message: String,
}

/// `FILE:LINE: [RULE] RESOURCE: MESSAGE` on one line, control characters escaped ([`Violation`]'s fields keep
/// the values as read).
impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Every part but the rule and the line comes from the checked files: escaped.
        write!(
            f,
            "{}:{}: [{}] {}: {}",
            escaped(&self.file.display().to_string()),
            self.line,
            self.rule,
            escaped(&self.resource),
            escaped(&self.message)
        )
    }
}

/// The result of checking one directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Report {
    /// The files read (`.tf`, `.tfvars`, or the plan JSON), in reading order.
    pub files: Vec<PathBuf>,
    /// How many `aws_sqs_queue` resources were checked.
    pub sqs_queues: usize,
    /// How many `azurerm_servicebus_queue` resources were checked.
    pub servicebus_queues: usize,
    /// How many `aws_dynamodb_table` resources were read (the inbox table among them is checked).
    pub dynamodb_tables: usize,
    /// Every violation, in file and line order.
    pub violations: Vec<Violation>,
    /// Advice that is not a violation (what producers must do for the
    /// identity to survive, what could not be checked and why), one line each.
    pub advice: Vec<String>,
}

impl Report {
    /// True when no rule is broken.
    pub fn is_clean(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one rule.
    pub fn of_rule(&self, rule: RuleId) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}
