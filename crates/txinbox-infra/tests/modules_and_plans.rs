//! check-infra on the Terraform teams write: queues defined through a local module (with `-var-file`s),
//! and plans in JSON (`terraform show -json PLAN`, fixtures written to the documented format:
//! `planned_values.root_module.resources[]` / `.child_modules[]`, `resource_changes[].change.after_unknown`,
//! `configuration.root_module.module_calls`). Each fixture is clean, each broken copy fails, and the same
//! mistake is reported the same way whether the queue is written inline, through a module or in a plan.

mod common;

use std::path::{Path, PathBuf};

use common::{aws_sample, copy_of, TempDir};
use txinbox_infra::{check, check_plan, CheckError, Input, Report, RuleId, WorkerSettings};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

fn module_fixture() -> PathBuf {
    fixtures().join("module-fifo")
}

fn plan_fixture(name: &str) -> PathBuf {
    fixtures().join("plan").join(name)
}

/// A copy of the module fixture (root and module) in a temporary directory.
fn module_copy(tag: &str) -> TempDir {
    let tmp = TempDir::new(tag);
    let copy = |from: &Path, to: &Path| {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                std::fs::copy(&path, to.join(path.file_name().unwrap())).unwrap();
            }
        }
    };
    copy(&module_fixture(), tmp.path());
    copy(
        &module_fixture().join("modules/fifo"),
        &tmp.path().join("modules/fifo"),
    );
    tmp
}

/// A plan fixture, edited as JSON, written to a temporary file.
fn plan_copy(
    name: &str,
    tag: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) -> (TempDir, PathBuf) {
    let mut plan: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(plan_fixture(name)).unwrap()).unwrap();
    edit(&mut plan);
    let tmp = TempDir::new(tag);
    let path = tmp.path().join("plan.json");
    std::fs::write(&path, serde_json::to_string_pretty(&plan).unwrap()).unwrap();
    (tmp, path)
}

/// The planned resource at `address` (in the root module or `module.queues`).
fn planned<'a>(plan: &'a mut serde_json::Value, address: &str) -> &'a mut serde_json::Value {
    let root = &mut plan["planned_values"]["root_module"];
    let in_module = address.starts_with("module.");
    let list = if in_module {
        &mut root["child_modules"][0]["resources"]
    } else {
        &mut root["resources"]
    };
    list.as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|r| r["address"] == address)
        .unwrap_or_else(|| panic!("{address} not planned"))
}

/// (rule, address without its module path): the same mistake gives the same pairs however it is written.
fn findings(report: &Report) -> Vec<(RuleId, String)> {
    let mut out: Vec<(RuleId, String)> = report
        .violations
        .iter()
        .map(|v| {
            let tail = match v.resource.rfind("module.") {
                Some(i) => {
                    let rest = &v.resource[i + "module.".len()..];
                    rest.split_once('.').map_or(rest, |(_, r)| r).to_owned()
                }
                None => v.resource.clone(),
            };
            (v.rule, tail)
        })
        .collect();
    out.sort();
    out
}

fn settings() -> WorkerSettings {
    WorkerSettings::default()
}

#[test]
fn local_module_is_read_with_its_inputs() {
    let report = check(&Input::dir(module_fixture()), &settings()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.sqs_queues, 2);
    // The root's two files, then the module's three.
    assert_eq!(report.files.len(), 5, "{:#?}", report.files);
    assert!(report
        .files
        .iter()
        .any(|f| f.ends_with("modules/fifo/main.tf") && !f.to_string_lossy().contains("/./")));
    // The redrive policy was followed into the module: producers are told to carry ce-id.
    assert!(
        report.advice.iter().any(|a| a
            .contains("module.queues.aws_sqs_queue.main: producers must set ce-id and ce-source")),
        "{:#?}",
        report.advice
    );
}

#[test]
fn var_file_breaks_the_module_input() {
    let input = Input::dir(module_fixture()).var_file(module_fixture().join("broken.tfvars"));
    let report = check(&input, &settings()).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    let v = &report.violations[0];
    assert_eq!(v.rule, RuleId::SqsVisibilityTimeoutTooShort);
    assert_eq!(v.resource, "module.queues.aws_sqs_queue.main");
    assert!(
        v.file.ends_with("modules/fifo/main.tf"),
        "{}",
        v.file.display()
    );
    assert!(
        v.message
            .starts_with("visibility_timeout_seconds = 30 (var.visibility_timeout_seconds"),
        "{}",
        v.message
    );

    // Terraform's order: terraform.tfvars, then *.auto.tfvars, then -var-file (the last wins).
    let dir = module_copy("tfvars-order");
    dir.write("terraform.tfvars", "visibility_timeout_seconds = 10\n");
    dir.write("b.auto.tfvars", "visibility_timeout_seconds = 20\n");
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    assert!(report.violations[0]
        .message
        .starts_with("visibility_timeout_seconds = 20"));
    dir.write("fixed.tfvars", "visibility_timeout_seconds = 90\n");
    let report = check(
        &Input::dir(dir.path()).var_file(dir.path().join("fixed.tfvars")),
        &settings(),
    )
    .unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
}

#[test]
fn broken_module_copy_fails() {
    let dir = module_copy("module-no-redrive");
    let main = dir.path().join("modules/fifo/main.tf");
    let text = std::fs::read_to_string(&main).unwrap();
    let start = text.find("  redrive_policy = jsonencode(").unwrap();
    let end = start + text[start..].find("})\n").unwrap() + 3;
    std::fs::write(&main, format!("{}{}", &text[..start], &text[end..])).unwrap();
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    let rules: Vec<RuleId> = report.violations.iter().map(|v| v.rule).collect();
    // No redrive policy: the queue has no DLQ (and the DLQ is no longer one: the worker's policy now
    // grants on a queue that is not its DLQ, which is not checked).
    assert!(rules.contains(&RuleId::SqsFifoMissingRedrive), "{rules:?}");
}

#[test]
fn plan_fixtures_are_clean() {
    for name in ["existing-queues.json", "first-apply.json"] {
        let report = check_plan(&plan_fixture(name), &settings()).unwrap();
        assert!(report.is_clean(), "{name}: {:#?}", report.violations);
        assert_eq!(report.sqs_queues, 2, "{name}");
        assert!(
            report
                .advice
                .iter()
                .any(|a| a.contains("producers must set ce-id")),
            "{name}: {:#?}",
            report.advice
        );
    }
    // A first plan knows the redrive policy only after apply: the DLQ is found from the configuration's
    // references, and what cannot be checked yet is said.
    let report = check_plan(&plan_fixture("first-apply.json"), &settings()).unwrap();
    assert!(report.advice.iter().any(|a| a.contains(
        "redrive_policy is known only after apply (it names module.queues.aws_sqs_queue.dlq)"
    )));
    // Its worker policy is read only at apply: the report says it is not checked.
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.contains("data.aws_iam_policy_document.worker is read only at apply")),
        "{:#?}",
        report.advice
    );
    // Input::detect: a file is a plan, a directory is Terraform.
    assert_eq!(
        Input::detect(plan_fixture("first-apply.json")),
        Input::Plan(plan_fixture("first-apply.json"))
    );
}

#[test]
fn broken_plan_copies_fail() {
    // No redrive policy on an existing queue.
    let (_tmp, path) = plan_copy("existing-queues.json", "plan-no-redrive", |p| {
        planned(p, "module.queues.aws_sqs_queue.main")["values"]["redrive_policy"] = "".into();
    });
    let report = check_plan(&path, &settings()).unwrap();
    // Nothing names the DLQ any more: it is checked as a FIFO queue of its own (no redrive policy, SQS's
    // 30-second visibility).
    let missing = [
        (
            RuleId::SqsFifoMissingRedrive,
            "aws_sqs_queue.dlq".to_owned(),
        ),
        (
            RuleId::SqsFifoMissingRedrive,
            "aws_sqs_queue.main".to_owned(),
        ),
        (
            RuleId::SqsVisibilityTimeoutTooShort,
            "aws_sqs_queue.dlq".to_owned(),
        ),
    ];
    assert_eq!(findings(&report), missing, "{:#?}", report.violations);

    // A first plan whose queue has no redrive policy at all.
    let (_tmp, path) = plan_copy("first-apply.json", "plan-create-no-redrive", |p| {
        for change in p["resource_changes"].as_array_mut().unwrap() {
            change["change"]["after_unknown"]
                .as_object_mut()
                .unwrap()
                .remove("redrive_policy");
        }
    });
    let report = check_plan(&path, &settings()).unwrap();
    assert_eq!(findings(&report), missing, "{:#?}", report.violations);

    // Content-based deduplication and a DLQ kept too long, in the planned values.
    let (_tmp, path) = plan_copy("existing-queues.json", "plan-dedup", |p| {
        planned(p, "module.queues.aws_sqs_queue.main")["values"]["content_based_deduplication"] =
            true.into();
        planned(p, "module.queues.aws_sqs_queue.main")["values"]["message_retention_seconds"] =
            1_209_600.into();
    });
    let report = check_plan(&path, &settings()).unwrap();
    assert_eq!(
        findings(&report),
        [
            (
                RuleId::SqsContentBasedDeduplication,
                "aws_sqs_queue.main".into()
            ),
            (RuleId::SqsRetentionExceedsInbox, "aws_sqs_queue.dlq".into()),
        ]
    );
}

#[test]
fn not_a_plan_is_an_error() {
    let tmp = TempDir::new("not-a-plan");
    tmp.write("plan.json", "{\"resources\": []}");
    let err = check_plan(&tmp.path().join("plan.json"), &settings()).unwrap_err();
    assert!(matches!(err, CheckError::Plan { .. }), "{err:?}");
    assert!(
        err.to_string()
            .contains("not the output of `terraform show -json PLAN`"),
        "{err}"
    );
    tmp.write("plan.json", "not json");
    let err = check_plan(&tmp.path().join("plan.json"), &settings()).unwrap_err();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
}

#[test]
fn registry_module_is_not_fetched_and_says_so() {
    let dir = copy_of(&aws_sample(), "registry");
    dir.write(
        "extra.tf",
        "module \"events\" {\n  source  = \"terraform-aws-modules/sqs/aws\"\n  version = \"~> 4.0\"\n  name    = \"events\"\n  fifo_queue = true\n}\n",
    );
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report
            .advice
            .iter()
            .any(|a| a.contains("module \"events\" (extra.tf:1)")
                && a.contains("check-infra reads no registry or remote module (no network)")
                && a.contains("terraform show -json")),
        "{:#?}",
        report.advice
    );
}

/// The same two mistakes — a visibility timeout shorter than two heartbeats, and a worker policy without
/// sqs:GetQueueUrl on the DLQ — written inline (the sample), through a local module, and in a plan.
#[test]
fn same_violations_inline_through_a_module_and_in_a_plan() {
    // Inline.
    let inline = copy_of(&aws_sample(), "same-inline");
    inline.write("terraform.tfvars", "visibility_timeout_seconds = 30\n");
    inline.edit(
        "iam.tf",
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]"#,
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]"#,
    );
    let inline = check(&Input::dir(inline.path()), &settings()).unwrap();

    // Through the module, with a -var-file.
    let module = module_copy("same-module");
    module.edit(
        "main.tf",
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueUrl", "sqs:GetQueueAttributes"]"#,
        r#"actions   = ["sqs:SendMessage", "sqs:GetQueueAttributes"]"#,
    );
    let module = check(
        &Input::dir(module.path()).var_file(module_fixture().join("broken.tfvars")),
        &settings(),
    )
    .unwrap();

    // In a plan.
    let (_tmp, path) = plan_copy("existing-queues.json", "same-plan", |p| {
        planned(p, "module.queues.aws_sqs_queue.main")["values"]["visibility_timeout_seconds"] =
            30.into();
        let doc = planned(p, "data.aws_iam_policy_document.worker");
        doc["values"]["statement"][1]["actions"] =
            serde_json::json!(["sqs:GetQueueAttributes", "sqs:SendMessage"]);
    });
    let plan = check_plan(&path, &settings()).unwrap();

    let expected = [
        (
            RuleId::SqsVisibilityTimeoutTooShort,
            "aws_sqs_queue.main".to_owned(),
        ),
        (
            RuleId::SqsWorkerPolicyMissingAction,
            "data.aws_iam_policy_document.worker".to_owned(),
        ),
    ];
    assert_eq!(findings(&inline), expected, "{:#?}", inline.violations);
    assert_eq!(findings(&module), expected, "{:#?}", module.violations);
    assert_eq!(findings(&plan), expected, "{:#?}", plan.violations);
    for report in [&inline, &module, &plan] {
        let iam = report
            .of_rule(RuleId::SqsWorkerPolicyMissingAction)
            .next()
            .unwrap();
        assert!(
            iam.message
                .contains("does not grant sqs:GetQueueUrl on the dead-letter queue"),
            "{}",
            iam.message
        );
    }
}

/// Resources with `count` (as community modules write them): `aws_sqs_queue.dlq[0].arn` is followed.
#[test]
fn counted_resources_are_followed() {
    let dir = TempDir::new("count");
    dir.write(
        "main.tf",
        r#"variable "create" {
  default = true
}

resource "aws_sqs_queue" "dlq" {
  count      = var.create ? 1 : 0
  name       = "orders-dlq.fifo"
  fifo_queue = true
}

resource "aws_sqs_queue" "this" {
  count                      = var.create ? 1 : 0
  name                       = "orders.fifo"
  fifo_queue                 = true
  visibility_timeout_seconds = 60
  redrive_policy = jsonencode({
    deadLetterTargetArn = aws_sqs_queue.dlq[0].arn
    maxReceiveCount     = 5
  })
}
"#,
    );
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert!(
        report.advice.iter().any(|a| a.contains(
            "aws_sqs_queue.this: producers must set ce-id and ce-source on every message: the identity must not rest on the MessageDeduplicationId, which does not survive the move to the dead-letter queue aws_sqs_queue.dlq"
        )),
        "{:#?}",
        report.advice
    );
    // Broken: the DLQ is a standard queue.
    dir.write(
        "main.tf",
        &dir.read("main.tf").replacen("  fifo_queue = true\n", "", 1),
    );
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    assert_eq!(
        findings(&report),
        [(RuleId::SqsFifoMissingRedrive, "aws_sqs_queue.this".into())]
    );
}

/// A Service Bus plan (queues in a child module, addressed by key as `for_each` makes them; role
/// assignments with known resource ids): clean, and each broken copy fails with its rule.
#[test]
fn servicebus_plan_and_its_broken_copies() {
    let name = "servicebus-existing.json";
    let report = check_plan(&plan_fixture(name), &settings()).unwrap();
    assert!(report.is_clean(), "{:#?}", report.violations);
    assert_eq!(report.servicebus_queues, 2);
    assert!(report.advice.is_empty(), "{:#?}", report.advice);

    let queue = r#"module.servicebus.azurerm_servicebus_queue.base_queues["orders"]"#;
    let poison = r#"module.servicebus.azurerm_servicebus_queue.base_queues["orders-poison"]"#;

    // The worker cannot send to the poison queue.
    let (_tmp, path) = plan_copy(name, "sb-plan-roles", |p| {
        p["planned_values"]["root_module"]["resources"]
            .as_array_mut()
            .unwrap()
            .retain(|r| r["address"] != "azurerm_role_assignment.worker_poison_sender");
    });
    let report = check_plan(&path, &settings()).unwrap();
    assert_eq!(report.violations.len(), 1, "{:#?}", report.violations);
    let v = &report.violations[0];
    assert_eq!(v.rule, RuleId::ServiceBusWorkerRoleMissing);
    assert_eq!(v.resource, "azurerm_role_assignment.worker_receiver");
    assert!(
        v.message.contains(&format!(
            "receives from {queue} (Azure Service Bus Data Receiver) but has no Azure Service Bus Data Sender on its poison queue {poison}"
        )),
        "{}",
        v.message
    );

    // Duplicate detection off on the queue, and a poison queue kept too long.
    let (_tmp, path) = plan_copy(name, "sb-plan-dedup", |p| {
        planned(p, queue)["values"]["requires_duplicate_detection"] = false.into();
        planned(p, poison)["values"]["default_message_ttl"] = "P14D".into();
    });
    let report = check_plan(&path, &settings()).unwrap();
    let rules: Vec<(RuleId, &str)> = report
        .violations
        .iter()
        .map(|v| (v.rule, v.resource.as_str()))
        .collect();
    assert_eq!(
        rules,
        [
            (RuleId::ServiceBusDuplicateDetectionOff, queue),
            (RuleId::ServiceBusRetentionPathExceedsInbox, poison),
        ],
        "{:#?}",
        report.violations
    );
}

/// A remote module's source may hold credentials (a token in an HTTPS Git URL's user info, Git's `sshkey`, S3's
/// `aws_access_key_secret`): the advice that names the source never prints them.
#[test]
fn remote_module_source_credentials_are_not_printed() {
    let dir = copy_of(&aws_sample(), "remote-secret");
    dir.write(
        "extra.tf",
        concat!(
            "module \"a\" {\n  source = \"git::https://oauth2:glpat-SECRET1@gitlab.example.com/infra/sqs.git?ref=v1.2.0\"\n}\n",
            "module \"b\" {\n  source = \"git::ssh://git@example.com/sqs.git?ref=v1&sshkey=U0VDUkVUMg\"\n}\n",
            "module \"c\" {\n  source = \"s3::https://s3.amazonaws.com/bucket/sqs.zip?aws_access_key_id=AKIAEXAMPLE&aws_access_key_secret=SECRET3\"\n}\n",
            // A token as the user name, as GitHub takes it over HTTPS.
            "module \"d\" {\n  source = \"git::https://ghp_SECRET4@github.com/o/sqs.git?ref=v1\"\n}\n",
        ),
    );
    let report = check(&Input::dir(dir.path()), &settings()).unwrap();
    let advice = report.advice.join("\n");
    for secret in [
        "glpat-SECRET1",
        "U0VDUkVUMg",
        "SECRET3",
        "AKIAEXAMPLE",
        "ghp_SECRET4",
    ] {
        assert!(!advice.contains(secret), "{secret} printed in {advice}");
    }
    // What identifies the module is kept.
    for kept in [
        "git::https://***@gitlab.example.com/infra/sqs.git?ref=v1.2.0",
        "git::https://***@github.com/o/sqs.git?ref=v1",
        "git::ssh://git@example.com/sqs.git?ref=v1&sshkey=***\"",
        "s3::https://s3.amazonaws.com/bucket/sqs.zip?aws_access_key_id=***&aws_access_key_secret=***",
    ] {
        assert!(advice.contains(kept), "{kept} not in {advice}");
    }
}
