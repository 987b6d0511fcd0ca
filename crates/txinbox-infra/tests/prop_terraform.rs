//! Property tests of check-infra's Terraform reader and rules on generated `main.tf` files: queues with odd
//! attribute values (numbers, strings, references, functions, nothing), or any text. Never a panic; a file is
//! checked (a report whose violations name a rule and a resource) or refused with a typed error that names
//! the file or the reason. Fuzzed, coverage-guided, by `fuzz/fuzz_targets/terraform.rs`.

use proptest::prelude::*;
use txinbox_infra::{check_dir, CheckError, WorkerSettings};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        Just("true".to_owned()),
        Just("\"PT1M\"".to_owned()),
        Just("\"P10675199DT2H48M5.4775807S\"".to_owned()),
        Just("var.missing".to_owned()),
        Just("aws_sqs_queue.dlq.arn".to_owned()),
        Just(
            "jsonencode({ deadLetterTargetArn = aws_sqs_queue.dlq.arn, maxReceiveCount = 5 })"
                .to_owned()
        ),
        Just("jsonencode({ maxReceiveCount = \"x\" })".to_owned()),
        Just("max(1, 2)".to_owned()),
        Just("[1, 2]".to_owned()),
        any::<String>().prop_map(|s| format!("{s:?}")),
    ]
}

fn attribute() -> impl Strategy<Value = String> {
    prop_oneof![
        Just("name".to_owned()),
        Just("fifo_queue".to_owned()),
        Just("visibility_timeout_seconds".to_owned()),
        Just("message_retention_seconds".to_owned()),
        Just("redrive_policy".to_owned()),
        Just("content_based_deduplication".to_owned()),
        Just("lock_duration".to_owned()),
        Just("max_delivery_count".to_owned()),
        Just("default_message_ttl".to_owned()),
        Just("requires_duplicate_detection".to_owned()),
        Just("dead_lettering_on_message_expiration".to_owned()),
        "[a-z_]{1,10}",
    ]
}

fn main_tf() -> impl Strategy<Value = String> {
    let resource = (
        prop_oneof![
            Just("aws_sqs_queue".to_owned()),
            Just("azurerm_servicebus_queue".to_owned()),
            Just("aws_iam_policy".to_owned()),
        ],
        "[a-z]{1,6}",
        proptest::collection::vec((attribute(), value()), 0..8),
    )
        .prop_map(|(kind, name, attrs)| {
            let body: String = attrs
                .iter()
                .map(|(k, v)| format!("  {k} = {v}\n"))
                .collect();
            format!("resource \"{kind}\" \"{name}\" {{\n{body}}}\n")
        });
    prop_oneof![
        4 => proptest::collection::vec(resource, 1..4).prop_map(|r| r.concat()),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_terraform_is_checked_or_refused_with_a_typed_error(tf in main_tf()) {
        let dir = std::env::temp_dir().join(format!(
            "txinbox-prop-tf-{}-{}",
            std::process::id(),
            uuid_like(&tf)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.tf"), &tf).unwrap();
        match check_dir(&dir, &WorkerSettings::default()) {
            Ok(report) => {
                prop_assert!(report.sqs_queues + report.servicebus_queues > 0);
                for v in &report.violations {
                    prop_assert!(!v.to_string().is_empty());
                }
            }
            Err(e) => {
                prop_assert!(!matches!(e, CheckError::Output(_)), "{:?}", e);
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A short name for a test case's directory.
fn uuid_like(s: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.hash(&mut h);
    h.finish()
}

/// Found by the `terraform` fuzz target (a 10-minute run): 203 bytes of nested expressions on which the HCL
/// parser (hcl-rs 0.20) backtracks exponentially: `txinbox check-infra` on this file was still running after 2
/// minutes (a 90-byte prefix takes 27 ms, a 70-byte one 3 ms; each unclosed level roughly triples it). A
/// Terraform file is input the checker does not control (a pull request's), so the reader checks the brackets in
/// linear time first and refuses the file before the parser sees it: the error is the bracket check's, naming
/// the line of the first `{` never closed.
#[test]
fn a_pathological_file_is_refused_before_the_parser_sees_it() {
    const INPUT: &str = "U-3={3<{B/B3*3-{B/B3<{B/B3*3-{B/B3*3-{B/B33<{BBx3*3-{B/B3*3-3*3-{B/B33<{BBx3*3-B/B3*3-{B/B3<{B/B3*3-{B/B3*3-{B/B33<{BBx3*3-{B/B3*3-3*3-{B/B33<{BBx3*3-{B/B3*3-{B/B3s<{B/B3*{B/B3*3-{B/B3s<{B/B3*3*<:{\n33=3=";
    let dir = std::env::temp_dir().join(format!("txinbox-tf-slow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("main.tf"), INPUT).unwrap();
    let err = check_dir(&dir, &WorkerSettings::default()).unwrap_err();
    std::fs::remove_dir_all(&dir).ok();
    match err {
        txinbox_infra::CheckError::Shape { line, detail, .. } => {
            assert_eq!((line, detail.as_str()), (1, "`{` is never closed"))
        }
        other => panic!("expected the bracket check's refusal, got {other}"),
    }
}

/// Values beyond the first property's: the edges of the numbers, fractions, null, heredocs, JSON documents,
/// lists of references.
fn wide_value() -> impl Strategy<Value = String> {
    prop_oneof![
        value(),
        any::<u64>().prop_map(|n| n.to_string()),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| format!("{f:e}")),
        Just("18446744073709551616".to_owned()),
        Just("-0.5".to_owned()),
        Just("1e308".to_owned()),
        Just("null".to_owned()),
        Just("\"\"".to_owned()),
        Just("{}".to_owned()),
        Just("<<EOT\n{\"Statement\": {\"Effect\": \"Deny\", \"NotAction\": \"*\", \"Resource\": []}}\nEOT".to_owned()),
        Just("jsonencode({ Statement = [{ Effect = \"Allow\", Action = \"*\", Resource = \"*\", Condition = {} }] })".to_owned()),
        Just("jsonencode({ Statement = \"x\" })".to_owned()),
        Just("jsonencode({ redrivePermission = \"denyAll\" })".to_owned()),
        Just("jsonencode({ redrivePermission = 5 })".to_owned()),
        Just("[aws_sqs_queue.q.arn, \"${aws_dynamodb_table.t.arn}/index/*\", \"*\"]".to_owned()),
        Just("aws_sqs_queue.q.id".to_owned()),
        Just("aws_servicebus_queue.q.id".to_owned()),
        Just("[\"dynamodb:*\", \"sqs:Receive?essage\", \"\"]".to_owned()),
        Just("\"arn:aws:sqs:*:*:*\"".to_owned()),
        Just("[\"${aws_sqs_queue.q.arn}*\", var.missing]".to_owned()),
        Just("\"${aws_sqs_queue.dlq.arn}?\"".to_owned()),
        Just("[data.aws_iam_policy_document.d.json, data.aws_iam_policy_document.d.json]".to_owned()),
        Just("[aws_sqs_queue.q.arn, 5, \"{}\", var.missing]".to_owned()),
        Just("[jsonencode({ Statement = [{ Sid = \"a\", Effect = \"Deny\", Action = \"sqs:*\", Resource = \"*\" }] })]".to_owned()),
        Just("\"arn:::::\"".to_owned()),
        "\"[A-Za-z:*?/.-]{0,12}\"",
    ]
}

fn wide_attribute() -> impl Strategy<Value = String> {
    prop_oneof![
        attribute(),
        Just("redrive_allow_policy".to_owned()),
        Just("queue_url".to_owned()),
        Just("policy".to_owned()),
        Just("hash_key".to_owned()),
        Just("range_key".to_owned()),
        Just("role_definition_name".to_owned()),
        Just("scope".to_owned()),
        Just("principal_id".to_owned()),
        Just("effect".to_owned()),
        Just("actions".to_owned()),
        Just("not_actions".to_owned()),
        Just("resources".to_owned()),
        Just("not_resources".to_owned()),
        Just("sid".to_owned()),
        Just("source_policy_documents".to_owned()),
        Just("override_policy_documents".to_owned()),
        Just("duplicate_detection_history_time_window".to_owned()),
    ]
}

/// A block of a kind the rules read: queues, redrive (allow) policies, IAM policies and policy documents
/// (with nested statement, condition and dynamic blocks), a DynamoDB table with nested blocks, role
/// assignments.
fn wide_tf() -> impl Strategy<Value = String> {
    let attrs = || proptest::collection::vec((wide_attribute(), wide_value()), 0..6);
    let body = |attrs: Vec<(String, String)>| -> String {
        attrs
            .iter()
            .map(|(k, v)| format!("  {k} = {v}\n"))
            .collect()
    };
    let block = (
        prop_oneof![
            Just("resource \"aws_sqs_queue\" \"q\"".to_owned()),
            Just("resource \"aws_sqs_queue\" \"dlq\"".to_owned()),
            Just("resource \"aws_sqs_queue_redrive_policy\" \"r\"".to_owned()),
            Just("resource \"aws_sqs_queue_redrive_allow_policy\" \"a\"".to_owned()),
            Just("resource \"aws_iam_policy\" \"p\"".to_owned()),
            Just("resource \"aws_iam_role_policy\" \"p\"".to_owned()),
            Just("data \"aws_iam_policy_document\" \"d\"".to_owned()),
            Just("resource \"aws_dynamodb_table\" \"t\"".to_owned()),
            Just("resource \"azurerm_servicebus_queue\" \"q\"".to_owned()),
            Just("resource \"azurerm_role_assignment\" \"r\"".to_owned()),
        ],
        attrs(),
        proptest::collection::vec(
            (
                prop_oneof![
                    Just("statement".to_owned()),
                    Just("dynamic \"statement\"".to_owned()),
                    Just("attribute".to_owned()),
                    Just("global_secondary_index".to_owned()),
                    Just("ttl".to_owned()),
                    Just("point_in_time_recovery".to_owned()),
                    Just("server_side_encryption".to_owned()),
                ],
                attrs(),
                proptest::bool::ANY,
            ),
            0..3,
        ),
    )
        .prop_map(move |(head, attrs, nested)| {
            let mut text = format!("{head} {{\n{}", body(attrs));
            for (ident, attrs, condition) in nested {
                let inner = format!(
                    "{}{}",
                    body(attrs),
                    if condition {
                        "  condition {\n    test = \"Bool\"\n    variable = \"aws:SecureTransport\"\n    values = [\"false\"]\n  }\n"
                    } else {
                        ""
                    }
                );
                if ident.starts_with("dynamic") {
                    text.push_str(&format!(
                        "{ident} {{\n  for_each = []\n  content {{\n{inner}  }}\n}}\n"
                    ));
                } else {
                    text.push_str(&format!("{ident} {{\n{inner}}}\n"));
                }
            }
            text.push_str("}\n");
            text
        });
    proptest::collection::vec(block, 1..5).prop_map(|b| b.concat())
}

proptest! {
    #![proptest_config(config())]

    /// The other kinds the rules read (IAM policies and documents, redrive policy resources, the DynamoDB
    /// table, role assignments), checked against a DynamoDB store so its rules run too: never a panic.
    #[test]
    fn any_policy_table_or_assignment_is_checked_or_refused(tf in wide_tf()) {
        let dir = std::env::temp_dir().join(format!(
            "txinbox-prop-tf-wide-{}-{}",
            std::process::id(),
            uuid_like(&tf)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("main.tf"), &tf).unwrap();
        let settings =
            WorkerSettings::from_toml_str("[store]\nurl = \"dynamodb://t\"\n").unwrap();
        match check_dir(&dir, &settings) {
            Ok(report) => {
                for v in &report.violations {
                    prop_assert!(!v.to_string().is_empty());
                }
            }
            Err(e) => {
                prop_assert!(!matches!(e, CheckError::Output(_)), "{:?}", e);
                prop_assert!(!e.to_string().is_empty());
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}
