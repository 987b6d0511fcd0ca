//! `txinbox inbox stats|show|rejections` and `txinbox effects run|stats` run as the real binary on a DynamoDB
//! store (`dynamodb://TABLE`) in DynamoDB Local (started by `scripts/dynamodb.sh`, `TXINBOX_DYNAMODB_ENDPOINT`),
//! a fresh table filled through the real inbox: two applied messages with one effect each, a payload
//! collision and a business duplicate. The binary finds the emulator through the standard AWS chain
//! (`AWS_ENDPOINT_URL_DYNAMODB`).

use std::process::{Command, Output};

use serde_json::Value;
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::{
    ConsumerName, Effect, Handled, HandlerError, IdentityPolicy, Inbox, Message, OutcomeKind,
    Worker,
};
use txinbox_crm_api::CrmApi;
use txinbox_dynamodb::{DynamoOptions, DynamoStore, DynamoTx};

const CONSUMER: &str = "crm-followup";
const SOURCE: &str = "crm";

fn endpoint() -> String {
    std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    })
}

#[derive(serde::Deserialize)]
struct Meeting {
    opportunity: String,
    meeting: String,
}

fn meeting(id: &str, opportunity: &str, meeting: &str) -> OutgoingMessage {
    OutgoingMessage::new(format!(
        r#"{{"opportunity":"{opportunity}","meeting":"{meeting}"}}"#
    ))
    .cloudevent(SOURCE, id, "meeting.ended")
    .group("opportunities")
}

/// A fresh table: m-1 and m-2 applied (one `create_task` effect each, to `crm`), a payload collision of m-1
/// and a business duplicate m-3 of m-2.
async fn populate() -> String {
    let client = txinbox_dynamodb::emulator_client(&endpoint());
    let table = format!("txinbox-cli-{}", uuid::Uuid::new_v4().simple());
    DynamoStore::create_table(&client, &table).await.unwrap();
    let store = DynamoStore::open(client, &table, DynamoOptions::default())
        .await
        .unwrap();
    let queue = MemoryQueue::new(QueueOptions::default().max_receive_count(Some(3)));
    for m in [
        meeting("m-1", "o-1", "x"),
        meeting("m-2", "o-1", "y"),
        meeting("m-1", "o-9", "z"),
        meeting("m-3", "o-1", "y"),
    ] {
        queue.send(m);
    }
    let processor = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new(CONSUMER).unwrap()),
    )
    .bind(|_tx: DynamoTx, msg: Message<Meeting>| async move {
        let task = format!("{}:{}", msg.body.opportunity, msg.body.meeting);
        // A JSON object: the body the local CRM API takes.
        let body = serde_json::json!({ "task": task }).to_string();
        Ok::<_, HandlerError>(Handled::reference(task).effect(Effect::new(
            "create_task",
            "crm",
            body.into_bytes(),
        )))
    })
    .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)));
    let report = Worker::new(queue.receiver(), processor)
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::Applied), 2, "{report:?}");
    assert_eq!(report.count(OutcomeKind::PayloadCollision), 1, "{report:?}");
    assert_eq!(
        report.count(OutcomeKind::BusinessDuplicate),
        1,
        "{report:?}"
    );
    table
}

/// The binary, with the emulator reached through the standard AWS chain and nothing else of the machine's
/// AWS settings.
fn txinbox(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_txinbox"))
        .args(args)
        .env_remove("TXINBOX_STORE_URL")
        .env_remove("AWS_PROFILE")
        .env_remove("AWS_ENDPOINT_URL")
        .env("AWS_ENDPOINT_URL_DYNAMODB", endpoint())
        .env("AWS_REGION", "us-east-1")
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws-credentials",
        )
        .output()
        .expect("run txinbox")
}

fn run(args: &[&str], expect: i32) -> String {
    let o = txinbox(args);
    assert_eq!(
        o.status.code(),
        Some(expect),
        "{args:?}: stdout {} stderr {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

fn json(store: &str, args: &[&str], expect: i32) -> Value {
    let mut all = vec!["inbox"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", store, "--json"]);
    let out = run(&all, expect);
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{all:?}: not JSON ({e}): {out}"))
}

fn human(store: &str, args: &[&str], expect: i32) -> String {
    let mut all = vec!["inbox"];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--store", store]);
    run(&all, expect)
}

/// Exit 2 with one line on stderr naming `needle`.
fn usage_error(args: &[&str], needle: &str) {
    let o = txinbox(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(err.starts_with("error: ") && err.contains(needle), "{err}");
    assert!(o.stdout.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_commands_read_a_dynamodb_store_through_the_binary() {
    let table = populate().await;
    let store = format!("dynamodb://{table}");
    let s = store.as_str();

    // Stats of the consumer: the same document as on SQL.
    let doc = json(s, &["stats", "--consumer", CONSUMER], 0);
    let consumers = doc["consumers"].as_array().unwrap();
    assert_eq!(consumers.len(), 1, "{doc}");
    let c = &consumers[0];
    assert_eq!(c["consumer"], CONSUMER);
    assert_eq!(c["inbox_rows"], 2);
    assert_eq!(c["rows_last_hour"], 2);
    assert!(c["oldest_processed_at"].is_string() && c["newest_processed_at"].is_string());
    assert_eq!(c["rejections"]["payload_collision"], 1);
    assert_eq!(c["rejections"]["business_duplicate"], 1);
    assert!(c["last_rejection_at"].is_string());
    assert_eq!(c["effects"]["pending"], 2);
    assert_eq!(c["effects"]["done"], 0);
    assert!(c["effect_lag_seconds"].as_f64().unwrap() >= 0.0);
    assert!(doc["measured_at"].is_string());
    let out = human(s, &["stats", "--consumer", CONSUMER], 0);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].starts_with("consumer"), "{out}");
    assert!(
        lines[1].starts_with(CONSUMER) && out.contains("pending=2"),
        "{out}"
    );
    // Without a consumer: one clear line.
    usage_error(
        &["inbox", "stats", "--store", s],
        "needs --consumer on a DynamoDB store",
    );

    // A collided message: its marker, the evidence of the altered copy, its effect.
    let show = [
        "show",
        "--consumer",
        CONSUMER,
        "--message-id",
        "m-1",
        "--source",
        SOURCE,
    ];
    let doc = json(s, &show, 0);
    assert_eq!(doc["found"], true);
    assert_eq!(doc["source"], SOURCE);
    let markers = doc["markers"].as_array().unwrap();
    assert_eq!(markers.len(), 1, "{doc}");
    let m = &markers[0];
    assert_eq!(m["business_key"], "followup:o-1:x");
    assert_eq!(m["result_reference"], "o-1:x");
    assert_eq!(m["delivery_count"], 1);
    let rej = doc["rejections"].as_array().unwrap();
    assert_eq!(rej.len(), 1, "{doc}");
    assert_eq!(rej[0]["kind"], "payload_collision");
    assert_eq!(rej[0]["conflicts_with"], m["payload_hash"]);
    assert!(rej[0]["id"].is_string(), "a UUID: {}", rej[0]["id"]);
    let fx = doc["effects"].as_array().unwrap();
    assert_eq!(fx.len(), 1, "{doc}");
    assert_eq!(fx[0]["name"], "create_task");
    assert_eq!(fx[0]["state"], "pending");
    assert_eq!(fx[0]["attempts"], 0);
    // By effect name (one GetItem): the same effect; another name: none.
    let mut named = show.to_vec();
    named.extend(["--effect", "create_task"]);
    assert_eq!(json(s, &named, 0)["effects"], doc["effects"]);
    let mut other = show.to_vec();
    other.extend(["--effect", "nope"]);
    assert_eq!(json(s, &other, 0)["effects"].as_array().unwrap().len(), 0);
    let out = human(s, &show, 0);
    assert!(
        out.contains("payload_collision") && out.contains("processed_at"),
        "{out}"
    );
    // The business duplicate names its holder.
    let doc = json(
        s,
        &[
            "show",
            "--consumer",
            CONSUMER,
            "--message-id",
            "m-3",
            "--source",
            SOURCE,
        ],
        0,
    );
    assert_eq!(doc["markers"].as_array().unwrap().len(), 0);
    assert_eq!(doc["rejections"][0]["kind"], "business_duplicate");
    assert_eq!(doc["rejections"][0]["conflicts_with"], "m-2");
    // Unknown: exit 1; without a source: one clear line.
    let out = human(
        s,
        &[
            "show",
            "--consumer",
            CONSUMER,
            "--message-id",
            "m-nope",
            "--source",
            SOURCE,
        ],
        1,
    );
    assert!(out.contains("not found"), "{out}");
    usage_error(
        &[
            "inbox",
            "show",
            "--store",
            s,
            "--consumer",
            CONSUMER,
            "--message-id",
            "m-1",
        ],
        "needs --source on a DynamoDB store",
    );

    // Rejections: newest first, by kind, limited; a consumer is required.
    let doc = json(s, &["rejections", "--consumer", CONSUMER], 0);
    assert_eq!(doc["count"], 2);
    assert_eq!(doc["rejections"][0]["kind"], "business_duplicate", "{doc}");
    assert_eq!(doc["rejections"][1]["kind"], "payload_collision");
    let doc = json(
        s,
        &[
            "rejections",
            "--consumer",
            CONSUMER,
            "--kind",
            "payload_collision",
        ],
        0,
    );
    assert_eq!(doc["count"], 1);
    assert_eq!(doc["rejections"][0]["message_id"], "m-1");
    let doc = json(
        s,
        &["rejections", "--consumer", CONSUMER, "--limit", "1"],
        0,
    );
    assert_eq!(
        (doc["count"].as_i64(), doc["limit"].as_i64()),
        (Some(1), Some(1))
    );
    assert_eq!(doc["rejections"][0]["kind"], "business_duplicate");
    let out = human(s, &["rejections", "--consumer", CONSUMER], 0);
    assert_eq!(out.lines().count(), 3, "{out}");
    assert!(out.starts_with("recorded_at"), "{out}");
    usage_error(
        &["inbox", "rejections", "--store", s],
        "needs --consumer on a DynamoDB store",
    );

    // Effects: counted, run once against the local CRM API, counted again.
    let out = run(&["effects", "stats", "--store", s], 0);
    let row = out
        .lines()
        .find(|l| l.starts_with(CONSUMER))
        .unwrap_or_else(|| panic!("{out}"));
    let cols: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cols[..4], [CONSUMER, "crm", "pending", "2"], "{out}");
    let crm = CrmApi::builder().start().await.expect("local CRM API");
    let url = crm.url();
    let out = run(
        &[
            "effects",
            "run",
            "--once",
            "--store",
            s,
            "--http",
            &format!("crm={url}/tasks"),
            "--confirm",
            &format!("crm={url}/tasks?idempotency_key={{key}}"),
        ],
        0,
    );
    assert!(out.contains("EffectReport"), "{out}");
    assert_eq!(crm.tasks().len(), 2, "{out}");
    let doc = json(s, &["stats", "--consumer", CONSUMER], 0);
    assert_eq!(doc["consumers"][0]["effects"]["done"], 2, "{doc}");
    assert_eq!(doc["consumers"][0]["effects"]["pending"], 0, "{doc}");
    assert!(doc["consumers"][0]["effect_lag_seconds"].is_null());

    // A table that is not there: exit 2, one line naming the table check.
    usage_error(
        &[
            "inbox",
            "stats",
            "--store",
            "dynamodb://no-such-table",
            "--consumer",
            CONSUMER,
        ],
        "store (dynamodb)",
    );
}
