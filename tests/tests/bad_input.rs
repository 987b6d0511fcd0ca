//! Bad input gets a typed error and a known outcome: dead-lettered with its reason, nothing applied, nothing
//! lost, no panic. Runs on SQLite and PostgreSQL.

use txinbox::mem::{MemoryQueue, OutgoingMessage, QueueState};
use txinbox::{
    BadInput, BodyFormat, ConsumerName, IdentityPolicy, Inbox, InputRules, Outcome,
    ReceivedMessage, Store,
};
use txinbox_e2e::{pg_store, sqlite_store, MetricTotals};
use txinbox_lab::lab::{lab_message, task_handler, CONSUMER};
use txinbox_lab::labdb::LabDb;

/// The follow-up business key computed from the raw message by the identity policy, which refuses a body
/// without the fields (`invalid_business_key`) before the typed body is built.
fn followup_business_key(m: &ReceivedMessage) -> Result<Option<String>, String> {
    let v: serde_json::Value =
        serde_json::from_slice(&m.body).map_err(|e| format!("body is not JSON: {e}"))?;
    let field = |k: &str| {
        v.get(k)
            .and_then(|x| x.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("missing {k}"))
    };
    Ok(Some(format!(
        "criar_tarefa_followup:{}:{}",
        field("opportunity")?,
        field("meeting")?
    )))
}

fn inbox<DB: LabDb>(store: Store<DB>) -> Inbox<Store<DB>> {
    Inbox::new(
        store,
        IdentityPolicy::new(ConsumerName::new(CONSUMER).unwrap())
            .business_key(followup_business_key),
    )
    .input_rules(
        InputRules::default()
            .body(BodyFormat::Json)
            .max_payload_bytes(1024)
            .contract_versions(["1"]),
    )
}

fn versioned(m: OutgoingMessage, v: &str) -> OutgoingMessage {
    m.attribute("ce-contractversion", v)
}

/// (case, message, expected dead-letter reason)
fn cases() -> Vec<(&'static str, OutgoingMessage, &'static str)> {
    let ok_body = lab_message(0).body;
    vec![
        (
            "no identity",
            OutgoingMessage::new(ok_body.clone()),
            "no_identity",
        ),
        (
            "ce-id without ce-source",
            OutgoingMessage::new(ok_body.clone()).attribute("ce-id", "evt-1"),
            "no_identity",
        ),
        (
            "control characters in the id",
            versioned(
                OutgoingMessage::new(ok_body.clone()).producer_id("evt\u{0}1"),
                "1",
            ),
            "invalid_identity",
        ),
        // Fields the marker row keeps beside the id: a NUL is refused by PostgreSQL's text and an oversized
        // tenant by the business-key index, so these must be refused before the transaction (not retried).
        (
            "control characters in the tenant",
            versioned(lab_message(0), "1").attribute("ce-tenantid", "ac\u{0}me"),
            "invalid_identity",
        ),
        (
            "oversized tenant",
            versioned(lab_message(0), "1").attribute("ce-tenantid", "t".repeat(4096)),
            "invalid_identity",
        ),
        (
            "control characters in the event type",
            versioned(lab_message(0), "1").attribute("ce-type", "crm.\u{0}ended"),
            "invalid_identity",
        ),
        (
            "body not UTF-8",
            versioned(lab_message(0), "1").body_bytes(vec![0xff, 0xfe, 0x00]),
            "invalid_utf8",
        ),
        (
            "body not JSON",
            versioned(lab_message(0), "1").body_bytes(b"{not json".to_vec()),
            "invalid_json",
        ),
        (
            "business key cannot be computed",
            versioned(lab_message(0), "1").body_bytes(br#"{"meeting":"reuniao_1"}"#.to_vec()),
            "invalid_business_key",
        ),
        (
            "business key too long",
            versioned(lab_message(0), "1").body_bytes(
                format!(
                    r#"{{"opportunity":"{}","meeting":"reuniao_1"}}"#,
                    "o".repeat(600)
                )
                .into_bytes(),
            ),
            "invalid_business_key",
        ),
        (
            "control characters in the business key",
            versioned(lab_message(0), "1")
                .body_bytes(br#"{"opportunity":"o\u0007","meeting":"reuniao_1"}"#.to_vec()),
            "invalid_business_key",
        ),
        (
            "oversized payload",
            versioned(lab_message(0), "1").body_bytes(vec![b' '; 2048]),
            "payload_too_large",
        ),
        (
            "unknown contract version",
            versioned(lab_message(0), "2"),
            "unsupported_contract_version",
        ),
        (
            "missing contract version",
            lab_message(0),
            "unsupported_contract_version",
        ),
    ]
}

trait BodyBytes {
    fn body_bytes(self, b: Vec<u8>) -> Self;
}
impl BodyBytes for OutgoingMessage {
    fn body_bytes(mut self, b: Vec<u8>) -> Self {
        self.body = b;
        self
    }
}

async fn run<DB: LabDb>(store: Store<DB>) {
    let (metrics, _guard) = MetricTotals::install_local();
    DB::create_tables(&store).await.unwrap();
    let inbox = inbox(store.clone());
    let h = task_handler::<Store<DB>>();
    let all = cases();
    let n = all.len();
    for (case, msg, reason) in all {
        let q = MemoryQueue::default();
        q.send(msg.clone());
        let d = q.receive_now(1).pop().unwrap();
        let outcome = inbox.process(d, &h).await;
        match &outcome {
            Outcome::DeadLettered { reason: r, detail } => {
                assert_eq!(r, reason, "{case}: {detail}");
                assert!(!detail.is_empty(), "{case}");
            }
            other => panic!("{case}: expected a dead-letter, got {other:?}"),
        }
        // Nothing lost: the message is in the DLQ, body and attributes intact, with its reason.
        let dl = q.dead_letters();
        assert_eq!(dl.len(), 1, "{case}");
        assert_eq!(
            dl[0].0, msg,
            "{case}: the dead letter keeps the message as sent"
        );
        assert_eq!(dl[0].1.reason, reason, "{case}");
        assert_eq!(
            q.state(),
            QueueState {
                dead_lettered: 1,
                ..QueueState::default()
            },
            "{case}"
        );
    }
    assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);
    assert_eq!(DB::count_tasks(&store).await.unwrap(), 0);
    assert_eq!(metrics.counter("txinbox_dead_letters_total", &[]), n as u64);
    assert_eq!(metrics.counter("txinbox_unknown_identity_total", &[]), 6);
    assert_eq!(
        metrics.counter("txinbox_contract_version_failures_total", &[]),
        2
    );
    assert_eq!(
        metrics.counter("txinbox_dead_letters_total", &[("reason", "invalid_json")]),
        1
    );
    assert_eq!(metrics.counter("txinbox_applied_total", &[]), 0);
}

#[tokio::test]
async fn bad_input_is_dead_lettered_with_its_reason_on_sqlite() {
    run(sqlite_store().await).await;
}

#[tokio::test]
async fn bad_input_is_dead_lettered_with_its_reason_on_postgres() {
    run(pg_store(2).await).await;
}

#[test]
fn invalid_consumer_names_are_typed_errors() {
    for bad in ["", "has space", "ümlaut", &"x".repeat(129), "semi;colon"] {
        match ConsumerName::new(bad) {
            Err(e @ BadInput::InvalidConsumerName { .. }) => {
                assert_eq!(e.reason(), "invalid_consumer_name")
            }
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert!(ConsumerName::new("billing.v2:eu-west_1").is_ok());
}
