//! The guides say what the vendors say, and keep saying it: each check below fails when a sentence a user relies
//! on is edited away, when the Terraform sample and the guide disagree on a figure, or when a guide points at
//! something outside this repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every Markdown file of the repository (not the build output, not dependencies).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    walk(&p, out);
                }
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    assert!(out.len() > 5, "found the guides: {out:?}");
    out
}

/// Text with line breaks and the Markdown quote/indent runs folded to single spaces, so that a sentence
/// wrapped over lines still matches.
fn folded(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn no_guide_points_outside_the_repository() {
    for p in markdown_files() {
        let text = std::fs::read_to_string(&p).unwrap();
        for bad in ["shared/docs", "§", "../shared"] {
            assert!(
                !text.contains(bad),
                "{} mentions `{bad}`: the repository stands alone",
                p.display()
            );
        }
    }
}

#[test]
fn service_bus_duplicate_detection_tiers_creation_and_window() {
    let guide = folded(&read("docs/servicebus.md"));
    for sentence in [
        "The basic tier of Service Bus doesn't support duplicate detection. The standard and premium tiers support duplicate detection.",
        "You can't enable or disable duplicate detection after the queue or topic is created. You can only do so at the time of creating the queue or topic.",
        "the message is reported as accepted (the send operation succeeds), but the newly sent message is instantly ignored and dropped",
    ] {
        assert!(guide.contains(sentence), "docs/servicebus.md must quote: {sentence}");
    }
    // The window the guide states is the one the sample sets.
    assert!(guide.contains("sets it to **PT10M** (10 minutes"));
    let sample: String = std::fs::read_dir(root().join("infra/azure-servicebus"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "tf"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        sample.contains("duplicate_detection_history_time_window") && sample.contains("\"PT10M\""),
        "infra/azure-servicebus sets the duplicate detection window to PT10M, as docs/servicebus.md says"
    );
    assert!(
        sample.contains("requires_duplicate_detection"),
        "the sample turns duplicate detection on (only possible at creation)"
    );
}

#[test]
fn sqs_fifo_window_and_dead_letter_move_say_what_aws_says() {
    let guide = folded(&read("docs/sqs.md"));
    for sentence in [
        // The DLQ move replaces the deduplication id.
        "when a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication ID will be replaced with the original message's ID",
        // A send dropped by the window still succeeds.
        "if a message with a particular MessageDeduplicationId is sent successfully, any messages sent with the same MessageDeduplicationId are accepted successfully but aren't delivered during the 5-minute deduplication interval",
        // High-throughput scope.
        "deduplication occurs at the message group level",
        "`SqsOptions::deduplication_id_identity(true)`",
    ] {
        assert!(guide.contains(sentence), "docs/sqs.md must say: {sentence}");
    }
}

#[test]
fn the_effects_guide_keeps_the_vendors_words_and_the_code_s_answer_table() {
    let guide = folded(&read("docs/effects.md"));
    for sentence in [
        "Subsequent requests with the same key return the same result, including 500 errors",
        "You can remove keys from the system automatically after they're at least 24 hours old",
        "Under normal operating conditions, data is searchable in under 1 minute",
        "If no objects match the query, the resulting array will be empty",
        "Idempotency keys are valid for a minimum period of 7 days after first submission",
        "HTTP 422 – Unprocessable Entity or HTTP 409 - Conflict status with the error code 704",
        "PayPal returns the latest status of the previous request that used that same header",
        "The server stores keys for 6 hours",
        "If any search condition is not met, the result is an empty object (`{}`)",
        "It may take a few moments for newly created or updated CRM objects to appear in search results",
        "If the external ID is matched multiple times, then a 300 error is reported, and the record isn't created or updated",
        "reuse an idempotency key with a different request payload, the resource SHOULD reply with a HTTP 422",
        "retried, while the original request is still being processed, the resource SHOULD reply with an HTTP 409",
    ] {
        assert!(guide.contains(sentence), "docs/effects.md no longer quotes: {sentence}");
    }
    // The guide's answer table is the code's default table.
    use txinbox::http::{Answer, AnswerTable};
    let t = AnswerTable::default();
    for (status, answer, row) in [
        (
            409,
            Answer::InProgress,
            "| 409: a request with this key is still being processed (the draft) | `in_progress` |",
        ),
        (
            422,
            Answer::KeyReused,
            "| 422: the key was used with another body (the draft) | `key_reused` |",
        ),
        (429, Answer::NotSent, "| 408, 425, 429 | `not_sent` |"),
        (
            503,
            Answer::RetryAfter,
            "| 503 **with** `Retry-After` | `retry_after` |",
        ),
        (
            502,
            Answer::Uncertain,
            "502, 504, any other 5xx; 1xx; 3xx | `uncertain` |",
        ),
        (400, Answer::Rejected, "| another 4xx | `rejected` |"),
    ] {
        assert_eq!(t.get(status), answer, "{status}");
        assert!(
            guide.contains(row),
            "docs/effects.md lost the row for {status}: {row}"
        );
    }
}

#[test]
fn the_dynamodb_guide_quotes_the_transaction_limits_and_names_the_store_s_iam_actions() {
    let guide = folded(&read("docs/dynamodb.md"));
    for sentence in [
        "`TransactWriteItems` is a synchronous write operation that groups up to 100 action requests.",
        "no two actions can target the same item.",
        "The aggregate size of the items in the transaction cannot exceed 4 MB.",
    ] {
        assert!(guide.contains(sentence), "docs/dynamodb.md must quote: {sentence}");
    }
    assert_eq!(txinbox::dynamodb::MAX_ACTIONS, 100);
    assert_eq!(txinbox::dynamodb::MAX_TRANSACTION_BYTES, 4 * 1024 * 1024);
    for action in txinbox::dynamodb::IAM_TABLE_ACTIONS
        .iter()
        .chain(&txinbox::dynamodb::IAM_INDEX_ACTIONS)
    {
        let name = action.trim_start_matches("dynamodb:");
        assert!(
            guide.contains(&format!("`{name}`")),
            "docs/dynamodb.md does not name the store's IAM action {action}"
        );
    }
}

/// The partitioned layout refuses to place a message by its broker time because of what AWS says a redrive and a
/// FIFO dead-letter move do to the enqueue time: the guide keeps the sentences its default rests on.
#[test]
fn the_partitions_guide_says_why_not_the_broker_s_time() {
    let guide = folded(&read("docs/partitions.md"));
    for sentence in [
        "The redrive task resets the retention period. All redriven messages are considered new messages with a new messageID and enqueueTimestamp",
        "resets when the message is moved to a dead-letter queue",
        "dead-lettered with reason `no_event_time`",
    ] {
        assert!(guide.contains(sentence), "docs/partitions.md lost: {sentence}");
    }
}
