//! The DynamoDB inbox table sample passes; one broken copy per check fails with its own rule id, message,
//! file and line, and nothing else.

mod common;

use common::{aws_sample, copy_of, dynamodb_sample, TempDir};
use txinbox_infra::{
    check_dir, check_plan, run_cli, RuleId, Violation, WorkerSettings,
    DYNAMODB_WORKER_INDEX_ACTIONS, DYNAMODB_WORKER_TABLE_ACTIONS,
};

const TABLE: &str = r#"resource "aws_dynamodb_table" "inbox""#;

fn dynamodb_settings(table: &str) -> WorkerSettings {
    WorkerSettings::from_toml_str(&format!("[store]\nurl = \"dynamodb://{table}\"\n")).unwrap()
}

/// Checks `dir` (with the sample's table as the store) and returns its only violation.
fn only_violation(dir: &TempDir) -> Violation {
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    report.violations.into_iter().next().unwrap()
}

fn assert_violation(v: &Violation, rule: RuleId, file: &str, line: usize, message: &str) {
    assert_eq!(v.rule, rule, "{v}");
    assert_eq!(v.file.file_name().unwrap(), file, "{v}");
    assert_eq!(v.line, line, "{v}");
    assert!(
        v.message.contains(message),
        "{:?} does not contain {message:?}",
        v.message
    );
}

#[test]
fn dynamodb_sample_has_no_violation() {
    for settings in [
        WorkerSettings::default(),
        dynamodb_settings("txinbox-inbox"),
    ] {
        let report = check_dir(&dynamodb_sample(), &settings).unwrap();
        assert!(report.is_clean(), "{:#?}", report.violations);
        assert!(report.advice.is_empty(), "{:#?}", report.advice);
        assert_eq!(report.dynamodb_tables, 1);
        assert_eq!(report.sqs_queues + report.servicebus_queues, 0);
        assert_eq!(report.files.len(), 5);
    }
}

#[test]
fn run_cli_on_the_dynamodb_sample_reports_ok() {
    let mut out = Vec::new();
    assert!(run_cli(&dynamodb_sample(), None, &mut out).unwrap());
    let out = String::from_utf8(out).unwrap();
    assert_eq!(out.lines().count(), 1, "{out}");
    assert!(
        out.starts_with("check-infra: ok, no violation in ")
            && out
                .trim_end()
                .ends_with("(5 files, 0 SQS queues, 0 Service Bus queues, 1 DynamoDB table)"),
        "{out}"
    );
}

/// The quoted strings of `actions = [...]` in the statement whose `sid` is `sid`.
fn statement_actions(iam: &str, sid: &str) -> Vec<String> {
    let start = iam.find(&format!("sid = \"{sid}\"")).expect(sid);
    let rest = &iam[start..];
    let list = &rest[rest.find("actions").unwrap()..];
    let list = &list[list.find('[').unwrap() + 1..list.find(']').unwrap()];
    list.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

#[test]
fn the_sample_grants_exactly_the_declared_actions() {
    let iam = std::fs::read_to_string(dynamodb_sample().join("iam.tf")).unwrap();
    assert_eq!(
        statement_actions(&iam, "InboxTable"),
        DYNAMODB_WORKER_TABLE_ACTIONS,
        "the inbox table's statement (also on TABLE_ARN/index/*)"
    );
    assert!(DYNAMODB_WORKER_INDEX_ACTIONS
        .iter()
        .all(|a| DYNAMODB_WORKER_TABLE_ACTIONS.contains(a)));
    assert!(iam.contains("\"${aws_dynamodb_table.inbox.arn}/index/*\""));
    // The business tables keep the item actions a handler's writes in the same transaction use.
    assert_eq!(
        statement_actions(&iam, "BusinessTables"),
        [
            "dynamodb:PutItem",
            "dynamodb:UpdateItem",
            "dynamodb:DeleteItem",
            "dynamodb:GetItem",
            "dynamodb:ConditionCheckItem",
        ]
    );
    for forbidden in [
        "Scan",
        "BatchWriteItem",
        "UpdateTable",
        "UpdateTimeToLive",
        "DeleteTable",
        "dynamodb:*",
        "TransactWriteItems\"",
    ] {
        assert!(
            !iam.contains(&format!("\"dynamodb:{forbidden}")),
            "{forbidden}"
        );
    }
}

#[test]
fn store_names_a_table_that_is_not_declared() {
    let dir = copy_of(&dynamodb_sample(), "ddb-missing");
    let report = check_dir(dir.path(), &dynamodb_settings("orders-inbox")).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    let v = &report.violations[0];
    // The first file read (iam.tf, in name order), line 1.
    assert_violation(
        v,
        RuleId::DynamoDbInboxTableMissing,
        "iam.tf",
        1,
        "store.url names the DynamoDB table \"orders-inbox\" but no aws_dynamodb_table in what was read has that name (declared: aws_dynamodb_table.inbox = \"txinbox-inbox\")",
    );
    assert_eq!(v.resource, "dynamodb://orders-inbox");
    assert!(v.to_string().ends_with(&format!(
        "iam.tf:1: [dynamodb-inbox-table-missing] dynamodb://orders-inbox: {}",
        v.message
    )));

    // A Terraform with only queues, and a DynamoDB store: the table is missing too.
    let report = check_dir(&aws_sample(), &dynamodb_settings("orders-inbox")).unwrap();
    assert_eq!(
        report
            .of_rule(RuleId::DynamoDbInboxTableMissing)
            .map(|v| v.message.contains("none is declared"))
            .collect::<Vec<_>>(),
        [true]
    );
}

#[test]
fn hash_key_other_than_pk() {
    let dir = copy_of(&dynamodb_sample(), "ddb-hash");
    dir.edit(
        "main.tf",
        r#"hash_key                    = "pk""#,
        r#"hash_key                    = "id""#,
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", r#""id""#);
    assert_violation(
        &v,
        RuleId::DynamoDbKeySchema,
        "main.tf",
        line,
        "hash_key = \"id\": the store addresses every item by the hash key pk (S) alone",
    );
    assert_eq!(v.resource, "aws_dynamodb_table.inbox");
}

#[test]
fn pk_of_another_type() {
    let dir = copy_of(&dynamodb_sample(), "ddb-pk-type");
    dir.edit_after(
        "main.tf",
        r#"name = "pk""#,
        r#"type = "S""#,
        r#"type = "N""#,
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", r#"type = "N""#);
    assert_violation(
        &v,
        RuleId::DynamoDbKeySchema,
        "main.tf",
        line,
        "attribute pk has type = \"N\"",
    );
}

#[test]
fn a_range_key() {
    let dir = copy_of(&dynamodb_sample(), "ddb-range");
    dir.edit(
        "main.tf",
        "  hash_key                    = \"pk\"\n",
        "  hash_key                    = \"pk\"\n  range_key                   = \"gsi1sk\"\n",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", "range_key                   =");
    assert_violation(
        &v,
        RuleId::DynamoDbKeySchema,
        "main.tf",
        line,
        "range_key = \"gsi1sk\"",
    );
}

#[test]
fn index_due_missing() {
    let dir = copy_of(&dynamodb_sample(), "ddb-no-due");
    let main = dir.read("main.tf");
    let start = main.find("  # Effects that are due").unwrap();
    let end = start + main[start..].find("  # Expired markers").unwrap();
    dir.write("main.tf", &format!("{}{}", &main[..start], &main[end..]));
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", TABLE);
    assert_violation(
        &v,
        RuleId::DynamoDbIndexMismatch,
        "main.tf",
        line,
        "no global_secondary_index \"due\" (hash_key = \"gsi2pk\", range_key = \"gsi2sk\", projection_type = \"KEYS_ONLY\")",
    );
}

#[test]
fn index_by_consumer_with_another_projection() {
    let dir = copy_of(&dynamodb_sample(), "ddb-projection");
    dir.edit(
        "main.tf",
        r#"projection_type = "ALL""#,
        r#"projection_type = "KEYS_ONLY" # wrong"#,
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", "# wrong");
    assert_violation(
        &v,
        RuleId::DynamoDbIndexMismatch,
        "main.tf",
        line,
        "global_secondary_index \"by_consumer\": projection_type = \"KEYS_ONLY\", the store expects hash_key = \"gsi1pk\", range_key = \"gsi1sk\", projection_type = \"ALL\"",
    );
}

#[test]
fn index_due_with_other_keys() {
    let dir = copy_of(&dynamodb_sample(), "ddb-due-keys");
    dir.edit(
        "main.tf",
        r#"range_key       = "gsi2sk""#,
        r#"range_key       = "gsi1sk""#,
    );
    let v = only_violation(&dir);
    let line = dir.line_after("main.tf", r#"name            = "due""#, "range_key");
    assert_violation(
        &v,
        RuleId::DynamoDbIndexMismatch,
        "main.tf",
        line,
        "global_secondary_index \"due\": range_key = \"gsi1sk\"",
    );
}

#[test]
fn ttl_disabled_on_another_attribute_or_missing() {
    let dir = copy_of(&dynamodb_sample(), "ddb-ttl-off");
    dir.edit_after(
        "main.tf",
        "ttl {",
        "enabled        = true",
        "enabled        = false",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", "enabled        = false");
    assert_violation(
        &v,
        RuleId::DynamoDbTtlOff,
        "main.tf",
        line,
        "ttl enabled = false: the store sets expires_at",
    );

    let dir = copy_of(&dynamodb_sample(), "ddb-ttl-attr");
    dir.edit(
        "main.tf",
        r#"attribute_name = "expires_at""#,
        r#"attribute_name = "ttl""#,
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", r#"attribute_name = "ttl""#);
    assert_violation(
        &v,
        RuleId::DynamoDbTtlOff,
        "main.tf",
        line,
        "ttl attribute_name = \"ttl\", not \"expires_at\"",
    );

    let dir = copy_of(&dynamodb_sample(), "ddb-no-ttl");
    dir.edit(
        "main.tf",
        "  ttl {\n    attribute_name = \"expires_at\"\n    enabled        = true\n  }\n",
        "",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", TABLE);
    assert_violation(&v, RuleId::DynamoDbTtlOff, "main.tf", line, "no ttl block");
}

#[test]
fn point_in_time_recovery_off_or_missing() {
    let dir = copy_of(&dynamodb_sample(), "ddb-pitr-off");
    dir.edit_after(
        "main.tf",
        "point_in_time_recovery {",
        "enabled = true",
        "enabled = false",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", "enabled = false");
    assert_violation(
        &v,
        RuleId::DynamoDbPitrOff,
        "main.tf",
        line,
        "point_in_time_recovery enabled = false",
    );

    let dir = copy_of(&dynamodb_sample(), "ddb-no-pitr");
    dir.edit(
        "main.tf",
        "  point_in_time_recovery {\n    enabled = true\n  }\n",
        "",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", TABLE);
    assert_violation(
        &v,
        RuleId::DynamoDbPitrOff,
        "main.tf",
        line,
        "no point_in_time_recovery block",
    );
}

#[test]
fn encryption_off_or_missing() {
    let dir = copy_of(&dynamodb_sample(), "ddb-sse-off");
    dir.edit_after(
        "main.tf",
        "server_side_encryption {",
        "enabled     = true",
        "enabled     = false",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", "enabled     = false");
    assert_violation(
        &v,
        RuleId::DynamoDbEncryptionOff,
        "main.tf",
        line,
        "server_side_encryption enabled = false",
    );

    let dir = copy_of(&dynamodb_sample(), "ddb-no-sse");
    let main = dir.read("main.tf");
    let start = main.find("  # A KMS key").unwrap();
    let end = start + main[start..].find("  }\n").unwrap() + 4;
    dir.write("main.tf", &format!("{}{}", &main[..start], &main[end..]));
    let v = only_violation(&dir);
    let line = dir.line_of("main.tf", TABLE);
    assert_violation(
        &v,
        RuleId::DynamoDbEncryptionOff,
        "main.tf",
        line,
        "no server_side_encryption block",
    );
}

#[test]
fn worker_policy_that_may_delete_markers_is_too_broad() {
    let dir = copy_of(&dynamodb_sample(), "ddb-delete-item");
    dir.edit(
        "iam.tf",
        "      \"dynamodb:UpdateItem\",\n      \"dynamodb:GetItem\",",
        "      \"dynamodb:UpdateItem\",\n      \"dynamodb:DeleteItem\",\n      \"dynamodb:GetItem\",",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("iam.tf", r#"data "aws_iam_policy_document" "worker""#);
    assert_violation(
        &v,
        RuleId::DynamoDbWorkerPolicyTooBroad,
        "iam.tf",
        line,
        "this policy grants dynamodb:DeleteItem on aws_dynamodb_table.inbox or its indexes, more than the DynamoDB store calls (dynamodb:PutItem, dynamodb:UpdateItem, dynamodb:GetItem, dynamodb:Query, dynamodb:DescribeTable, dynamodb:DescribeTimeToLive); it lets the worker delete markers, after which a redelivered message is applied again (DeleteItem; the store never deletes, time to live does)",
    );
}

#[test]
fn worker_policy_with_condition_check_on_the_inbox_is_too_broad() {
    // Read-like and harmless, but the store makes no condition check on its own table: named as any unneeded
    // action, without a reason.
    let dir = copy_of(&dynamodb_sample(), "ddb-condition-check");
    dir.edit(
        "iam.tf",
        "      \"dynamodb:DescribeTimeToLive\",\n",
        "      \"dynamodb:DescribeTimeToLive\",\n      \"dynamodb:ConditionCheckItem\",\n",
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyTooBroad, "{v}");
    assert!(
        v.message
            .contains("grants dynamodb:ConditionCheckItem on aws_dynamodb_table.inbox")
            && !v.message.contains("it lets the worker"),
        "{}",
        v.message
    );
}

#[test]
fn business_tables_keep_delete_and_condition_check() {
    // The item actions of a handler's writes on an application table, in the worker's policy: not the inbox's,
    // no finding. (The sample's BusinessTables statement is a `dynamic` block, which is not expanded: this one
    // is static.)
    let statement = |arn: &str| {
        format!(
            "  statement {{\n    sid = \"Orders\"\n    actions = [\"dynamodb:PutItem\", \"dynamodb:UpdateItem\", \"dynamodb:DeleteItem\", \"dynamodb:GetItem\", \"dynamodb:ConditionCheckItem\"]\n    resources = [\"{arn}\"]\n  }}\n\n  # The application's tables"
        )
    };
    let dir = copy_of(&dynamodb_sample(), "ddb-business");
    dir.edit(
        "iam.tf",
        "  # The application's tables",
        &statement("arn:aws:dynamodb:eu-west-1:123456789012:table/orders"),
    );
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    // The same statement on the inbox table is too broad.
    let dir = copy_of(&dynamodb_sample(), "ddb-business-on-inbox");
    dir.edit(
        "iam.tf",
        "  # The application's tables",
        &statement("arn:aws:dynamodb:eu-west-1:123456789012:table/txinbox-inbox"),
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyTooBroad, "{v}");
    assert!(
        v.message.contains(
            "grants dynamodb:DeleteItem, dynamodb:ConditionCheckItem on aws_dynamodb_table.inbox"
        ) && v.message.contains("delete markers"),
        "{}",
        v.message
    );
}

#[test]
fn worker_policy_without_the_indexes() {
    let dir = copy_of(&dynamodb_sample(), "ddb-no-index");
    dir.edit(
        "iam.tf",
        "      \"${aws_dynamodb_table.inbox.arn}/index/*\",\n",
        "",
    );
    let v = only_violation(&dir);
    let line = dir.line_of("iam.tf", r#"data "aws_iam_policy_document" "worker""#);
    assert_violation(
        &v,
        RuleId::DynamoDbWorkerPolicyMissingAction,
        "iam.tf",
        line,
        "does not grant dynamodb:Query on its index by_consumer (TABLE_ARN/index/by_consumer) and dynamodb:Query on its index due (TABLE_ARN/index/due)",
    );
}

#[test]
fn worker_policy_with_dynamodb_star() {
    let dir = copy_of(&dynamodb_sample(), "ddb-star");
    let iam = dir.read("iam.tf");
    let start = iam.find("      \"dynamodb:PutItem\",").unwrap();
    let end = iam
        .find("    ]\n    resources = [\n      aws_dynamodb_table.inbox.arn,")
        .unwrap();
    dir.write(
        "iam.tf",
        &format!("{}      \"dynamodb:*\",\n{}", &iam[..start], &iam[end..]),
    );
    let v = only_violation(&dir);
    let line = dir.line_of("iam.tf", r#"data "aws_iam_policy_document" "worker""#);
    assert_violation(
        &v,
        RuleId::DynamoDbWorkerPolicyTooBroad,
        "iam.tf",
        line,
        "this policy grants dynamodb:* on aws_dynamodb_table.inbox or its indexes, more than the DynamoDB store calls",
    );
    for what in [
        "(DeleteItem;",
        "(Scan)",
        "(BatchWriteItem)",
        "(UpdateTable)",
        "(UpdateTimeToLive)",
        "(DeleteTable)",
    ] {
        assert!(v.message.contains(what), "{what}: {}", v.message);
    }
}

#[test]
fn worker_policy_with_scan() {
    let dir = copy_of(&dynamodb_sample(), "ddb-scan");
    dir.edit(
        "iam.tf",
        "      \"dynamodb:DescribeTimeToLive\",\n",
        "      \"dynamodb:DescribeTimeToLive\",\n      \"dynamodb:Scan\",\n",
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyTooBroad, "{v}");
    assert!(
        v.message
            .contains("grants dynamodb:Scan on aws_dynamodb_table.inbox")
            && v.message.contains("read every item (Scan)")
            && !v.message.contains("DeleteTable)"),
        "{}",
        v.message
    );
}

#[test]
fn worker_policy_by_literal_arns_passes() {
    let dir = copy_of(&dynamodb_sample(), "ddb-literal");
    dir.edit(
        "iam.tf",
        "      aws_dynamodb_table.inbox.arn,\n      \"${aws_dynamodb_table.inbox.arn}/index/*\",\n",
        "      \"arn:aws:dynamodb:*:*:table/txinbox-inbox\",\n      \"arn:aws:dynamodb:*:*:table/txinbox-inbox/index/*\",\n",
    );
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn a_read_only_policy_is_not_a_workers_and_is_advised() {
    let dir = copy_of(&dynamodb_sample(), "ddb-read-only");
    dir.edit("iam.tf", "      \"dynamodb:PutItem\",\n      \"dynamodb:UpdateItem\",\n      \"dynamodb:GetItem\",\n      \"dynamodb:Query\",\n      \"dynamodb:DescribeTable\",", "      \"dynamodb:GetItem\",\n      \"dynamodb:Query\",\n      \"dynamodb:DescribeTable\",");
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.advice.len(), 1, "{:#?}", report.advice);
    assert!(report.advice[0].contains("aws_dynamodb_table.inbox: no IAM policy in what was read grants dynamodb:PutItem on this table"), "{}", report.advice[0]);
}

#[test]
fn other_tables_are_not_the_inbox() {
    // A business table in the same Terraform, without the inbox's indexes: not checked.
    let dir = copy_of(&dynamodb_sample(), "ddb-business");
    dir.write(
        "orders.tf",
        "resource \"aws_dynamodb_table\" \"orders\" {\n  name         = \"orders\"\n  billing_mode = \"PAY_PER_REQUEST\"\n  hash_key     = \"id\"\n\n  attribute {\n    name = \"id\"\n    type = \"S\"\n  }\n}\n",
    );
    for settings in [
        WorkerSettings::default(),
        dynamodb_settings("txinbox-inbox"),
    ] {
        let report = check_dir(dir.path(), &settings).unwrap();
        assert!(report.is_clean(), "{:#?}", report.violations);
        assert_eq!(report.dynamodb_tables, 2);
    }
    // Named by the store, it is checked.
    let report = check_dir(dir.path(), &dynamodb_settings("orders")).unwrap();
    let rules: Vec<RuleId> = report.violations.iter().map(|v| v.rule).collect();
    assert_eq!(
        rules,
        // On the block's line (in rule order), then hash_key's line.
        [
            RuleId::DynamoDbIndexMismatch,
            RuleId::DynamoDbIndexMismatch,
            RuleId::DynamoDbTtlOff,
            RuleId::DynamoDbPitrOff,
            RuleId::DynamoDbEncryptionOff,
            RuleId::DynamoDbKeySchema,
        ],
        "{:#?}",
        report.violations
    );
}

#[test]
fn a_table_name_that_cannot_be_resolved_is_reported() {
    let dir = copy_of(&dynamodb_sample(), "ddb-unknown");
    dir.edit(
        "main.tf",
        "name                        = var.table_name",
        "name                        = var.no_such_variable",
    );
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    assert!(report.violations[0]
        .message
        .contains("declared: aws_dynamodb_table.inbox (name not known statically)"));
}

/// A plan (`terraform show -json`) of the sample, with `ttl` off and no point-in-time recovery.
#[test]
fn plan_of_a_broken_table() {
    let tmp = TempDir::new("ddb-plan");
    let table = |ttl: bool, pitr: bool| {
        serde_json::json!({
            "address": "aws_dynamodb_table.inbox",
            "mode": "managed",
            "type": "aws_dynamodb_table",
            "name": "inbox",
            "values": {
                "name": "txinbox-inbox",
                "billing_mode": "PAY_PER_REQUEST",
                "hash_key": "pk",
                "range_key": null,
                "attribute": [
                    {"name": "gsi1pk", "type": "S"}, {"name": "gsi1sk", "type": "S"},
                    {"name": "gsi2pk", "type": "S"}, {"name": "gsi2sk", "type": "S"},
                    {"name": "pk", "type": "S"}
                ],
                "global_secondary_index": [
                    {"name": "by_consumer", "hash_key": "gsi1pk", "range_key": "gsi1sk", "projection_type": "ALL", "non_key_attributes": []},
                    {"name": "due", "hash_key": "gsi2pk", "range_key": "gsi2sk", "projection_type": "KEYS_ONLY", "non_key_attributes": []}
                ],
                "ttl": [{"attribute_name": "expires_at", "enabled": ttl}],
                "point_in_time_recovery": if pitr { serde_json::json!([{"enabled": true}]) } else { serde_json::json!([]) },
                "server_side_encryption": [{"enabled": true, "kms_key_arn": null}]
            }
        })
    };
    let plan = |ttl: bool, pitr: bool| {
        serde_json::json!({
            "format_version": "1.2",
            "planned_values": {"root_module": {"resources": [table(ttl, pitr)]}},
            "resource_changes": [],
            "configuration": {"root_module": {"resources": []}}
        })
    };
    tmp.write(
        "ok.json",
        &serde_json::to_string_pretty(&plan(true, true)).unwrap(),
    );
    let report = check_plan(
        &tmp.path().join("ok.json"),
        &dynamodb_settings("txinbox-inbox"),
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.dynamodb_tables, 1);

    tmp.write(
        "broken.json",
        &serde_json::to_string_pretty(&plan(false, false)).unwrap(),
    );
    let report = check_plan(
        &tmp.path().join("broken.json"),
        &dynamodb_settings("txinbox-inbox"),
    )
    .unwrap();
    let found: Vec<(RuleId, &str)> = report
        .violations
        .iter()
        .map(|v| (v.rule, v.resource.as_str()))
        .collect();
    // The missing block on the resource's line, then the ttl attribute's line.
    assert_eq!(
        found,
        [
            (RuleId::DynamoDbPitrOff, "aws_dynamodb_table.inbox"),
            (RuleId::DynamoDbTtlOff, "aws_dynamodb_table.inbox"),
        ],
        "{:#?}",
        report.violations
    );
}

/// An Allow with `NotAction` grants every action but those listed ("explicitly matches everything except the
/// specified list of actions"): on the inbox table it lets the worker delete markers.
#[test]
fn worker_policy_with_not_action_is_too_broad() {
    let dir = copy_of(&dynamodb_sample(), "ddb-not-action");
    dir.edit(
        "iam.tf",
        "  statement {\n    sid = \"InboxTable\"\n",
        "  statement {\n    sid           = \"AllButIam\"\n    not_actions   = [\"iam:*\"]\n    resources     = [aws_dynamodb_table.inbox.arn]\n  }\n\n  statement {\n    sid = \"InboxTable\"\n",
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyTooBroad, "{v}");
    for what in [
        "NotAction [iam:*]",
        "(DeleteItem;",
        "(Scan)",
        "(DeleteTable)",
    ] {
        assert!(v.message.contains(what), "{what}: {}", v.message);
    }
}

/// An explicit Deny of a needed action overrides the Allow; a denied forbidden action is not named.
#[test]
fn worker_policy_with_a_deny_on_the_table() {
    let dir = copy_of(&dynamodb_sample(), "ddb-deny");
    dir.edit(
        "iam.tf",
        "  statement {\n    sid = \"InboxTable\"\n",
        "  statement {\n    sid       = \"NoQuery\"\n    effect    = \"Deny\"\n    actions   = [\"dynamodb:Query\", \"dynamodb:DeleteItem\"]\n    resources = [\"*\"]\n  }\n\n  statement {\n    sid = \"InboxTable\"\n",
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyMissingAction, "{v}");
    assert!(
        v.message
            .contains("dynamodb:Query on aws_dynamodb_table.inbox"),
        "{}",
        v.message
    );
}

/// The settings' store URL of another store (PostgreSQL, with its password) is named in the advice that no table
/// was checked, without the password.
#[test]
fn another_stores_url_is_named_without_its_password() {
    let dir = TempDir::new("ddb-pg-url");
    dir.write(
        "main.tf",
        "resource \"aws_dynamodb_table\" \"other\" {\n  name     = \"other\"\n  hash_key = \"id\"\n  attribute {\n    name = \"id\"\n    type = \"S\"\n  }\n}\n",
    );
    let settings = WorkerSettings::from_toml_str(
        "[store]\nurl = \"postgres://inbox:s3cret-pw@db.internal/inbox\"\n",
    )
    .unwrap();
    let report = check_dir(dir.path(), &settings).unwrap();
    let advice = report.advice.join("\n");
    assert!(
        advice.contains("postgres://inbox:***@db.internal/inbox"),
        "{advice}"
    );
    assert!(!advice.contains("s3cret-pw"), "{advice}");
}

/// A `dynamic` block is as many blocks as its for_each has elements: `for_each = var.pitr ? [1] : []` with
/// `pitr = false` leaves the table without point-in-time recovery, whatever its content says; a for_each that
/// cannot be resolved statically is reported so.
#[test]
fn dynamic_block_counts_its_for_each() {
    let dir = copy_of(&dynamodb_sample(), "ddb-dynamic-pitr");
    dir.edit(
        "main.tf",
        "  point_in_time_recovery {\n    enabled = true\n  }\n",
        "  dynamic \"point_in_time_recovery\" {\n    for_each = var.pitr ? [1] : []\n    content {\n      enabled = true\n    }\n  }\n",
    );
    dir.write(
        "pitr.tf",
        "variable \"pitr\" {\n  type    = bool\n  default = false\n}\n",
    );
    let v = only_violation(&dir);
    assert_violation(
        &v,
        RuleId::DynamoDbPitrOff,
        "main.tf",
        dir.line_of("main.tf", TABLE),
        "no point_in_time_recovery block",
    );

    // With the block made: clean.
    dir.write(
        "pitr.tf",
        "variable \"pitr\" {\n  type    = bool\n  default = true\n}\n",
    );
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);

    // Not known statically: reported so.
    dir.write("pitr.tf", "variable \"pitr\" {\n  type = bool\n}\n");
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbPitrOff, "{v}");
    assert!(
        v.message
            .contains("in a dynamic block whose for_each cannot be resolved statically"),
        "{}",
        v.message
    );
}

/// A `dynamic "statement"` whose for_each is known and not empty is read: one that allows `dynamodb:*` on the
/// inbox table is too broad; with an empty for_each it makes no statement.
#[test]
fn dynamic_statement_with_a_known_for_each_is_read() {
    let dir = copy_of(&dynamodb_sample(), "ddb-dynamic-statement");
    dir.edit(
        "iam.tf",
        "  statement {\n    sid = \"InboxTable\"\n",
        "  dynamic \"statement\" {\n    for_each = [\"all\"]\n    content {\n      sid       = \"Everything\"\n      actions   = [\"dynamodb:*\"]\n      resources = [aws_dynamodb_table.inbox.arn]\n    }\n  }\n\n  statement {\n    sid = \"InboxTable\"\n",
    );
    let v = only_violation(&dir);
    assert_eq!(v.rule, RuleId::DynamoDbWorkerPolicyTooBroad, "{v}");
    assert!(v.message.contains("dynamodb:*"), "{}", v.message);

    let text = dir
        .read("iam.tf")
        .replace("for_each = [\"all\"]", "for_each = []");
    dir.write("iam.tf", &text);
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

/// An Allow with a condition (`dynamodb:LeadingKeys`, ...) may not grant at runtime: the worker's actions it
/// alone grants are advice, not a clean pass nor a violation.
#[test]
fn worker_policy_granting_under_a_condition() {
    let dir = copy_of(&dynamodb_sample(), "ddb-conditional-allow");
    dir.edit(
        "iam.tf",
        "      \"${aws_dynamodb_table.inbox.arn}/index/*\",\n    ]\n",
        "      \"${aws_dynamodb_table.inbox.arn}/index/*\",\n    ]\n    condition {\n      test     = \"ForAllValues:StringLike\"\n      variable = \"dynamodb:LeadingKeys\"\n      values   = [\"orders#*\"]\n    }\n",
    );
    let report = check_dir(dir.path(), &dynamodb_settings("txinbox-inbox")).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "data.aws_iam_policy_document.worker: this policy grants dynamodb:PutItem, dynamodb:UpdateItem, dynamodb:GetItem, dynamodb:Query, dynamodb:DescribeTable, dynamodb:DescribeTimeToLive on aws_dynamodb_table.inbox only under a condition (statement \"InboxTable\")"
        )),
        "{:#?}",
        report.advice
    );
}
