//! Every failure window of the pattern, on SQLite, on PostgreSQL and on DynamoDB (DynamoDB Local,
//! `TXINBOX_DYNAMODB_ENDPOINT`): inbox rows, business effects, broker state, evidence rows and the metrics each
//! window must leave. The expected values are spelled out here, apart from the lab's own checks.

use txinbox::mem::QueueState;
use txinbox_e2e::pg_url;
use txinbox_lab::lab::Target;
use txinbox_lab::windows::{run_on, run_on_batch, Window, WindowRow};

#[derive(Clone)]
struct Expect {
    rows: i64,
    effects: i64,
    dlq: usize,
    rejections: i64,
    signals: Vec<(&'static str, u64)>,
}

fn check(row: &WindowRow, e: &Expect) {
    assert!(row.ok(), "{row}");
    assert_eq!(row.inbox_rows, e.rows, "inbox rows: {row}");
    assert_eq!(row.business_effects, e.effects, "business effects: {row}");
    assert_eq!(
        row.broker,
        QueueState {
            dead_lettered: e.dlq,
            ..QueueState::default()
        },
        "broker: {row}"
    );
    assert_eq!(row.rejections, e.rejections, "evidence rows: {row}");
    for (name, n) in &e.signals {
        assert_eq!(row.signal(name), *n, "metric {name}: {row}");
    }
}

fn dynamodb() -> Target {
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").expect(
        "TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)",
    );
    Target::Dynamodb {
        table: "windows".into(),
        endpoint: Some(endpoint),
    }
}

async fn on_every_store(w: Window, e: Expect) {
    let lite = run_on(&Target::Sqlite("sqlite::memory:".into()), w)
        .await
        .expect("sqlite window");
    check(&lite, &e);
    let pg = run_on(&Target::Postgres(pg_url()), w)
        .await
        .expect("postgres window");
    check(&pg, &e);
    let mut on_dynamodb = e;
    if w == Window::AfterRetentionExpired {
        // DynamoDB's TTL deletes expired markers, later and at no write cost: the maintenance deletes none,
        // the marker stays until the TTL's pass, and the late copy is refused all the same.
        on_dynamodb.rows = 1;
        for (name, n) in &mut on_dynamodb.signals {
            if *name == "txinbox_retention_purged_total" {
                *n = 0;
            }
        }
    }
    let dynamo = run_on(&dynamodb(), w).await.expect("dynamodb window");
    check(&dynamo, &on_dynamodb);
}

/// The failure windows of batch mode on DynamoDB (one `TransactWriteItems` per batch, no savepoints), with
/// batches of 10 and of 3; SQLite and PostgreSQL run them in `txinbox-store`'s tests.
#[tokio::test(flavor = "current_thread")]
async fn batch_windows_on_dynamodb() {
    let mut failed = Vec::new();
    for batch in [10, 3] {
        for w in Window::BATCH {
            let row = run_on_batch(&dynamodb(), w, batch)
                .await
                .unwrap_or_else(|e| panic!("{}: {e}", w.name()));
            println!("{row}");
            if !row.ok() {
                failed.push(row.to_string());
            }
        }
    }
    assert!(failed.is_empty(), "{failed:#?}");
}

macro_rules! window_test {
    ($name:ident, $w:expr, $rows:expr, $effects:expr, $dlq:expr, $rej:expr, [$(($sig:expr, $n:expr)),*]) => {
        #[tokio::test]
        async fn $name() {
            on_every_store($w, Expect { rows: $rows, effects: $effects, dlq: $dlq, rejections: $rej, signals: vec![$(($sig, $n)),*] }).await;
        }
    };
}

window_test!(
    before_transaction,
    Window::BeforeTransaction,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_applied_after_redelivery_total", 1),
        ("txinbox_duplicates_total", 0)
    ]
);
window_test!(
    after_insert_before_change,
    Window::AfterInsertBeforeChange,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_applied_after_redelivery_total", 1),
        ("txinbox_duplicates_total", 0)
    ]
);
window_test!(
    after_change_before_commit,
    Window::AfterChangeBeforeCommit,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_applied_after_redelivery_total", 1),
        ("txinbox_duplicates_total", 0)
    ]
);
window_test!(
    after_commit_before_settle,
    Window::AfterCommitBeforeSettle,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_duplicates_total", 1),
        ("txinbox_received_total", 2)
    ]
);
window_test!(
    lock_lost_during_work,
    Window::LockLostDuringWork,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_duplicates_total", 1),
        ("txinbox_lease_lost_total", 1),
        ("txinbox_settle_failures_total", 1)
    ]
);
window_test!(
    two_concurrent_deliveries,
    Window::TwoConcurrentDeliveries,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_duplicates_total", 1),
        ("txinbox_concurrent_conflicts_total", 1)
    ]
);
window_test!(
    after_dlq_redrive,
    Window::AfterDlqRedrive,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_duplicates_total", 1),
        ("txinbox_redriven_total", 1)
    ]
);
window_test!(
    same_id_other_payload,
    Window::SameIdOtherPayload,
    1,
    1,
    1,
    1,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_payload_collisions_total", 1),
        ("txinbox_dead_letters_total", 1),
        ("txinbox_duplicates_total", 0)
    ]
);
window_test!(
    other_id_same_business_action,
    Window::OtherIdSameBusinessAction,
    1,
    1,
    0,
    1,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_business_duplicates_total", 1),
        ("txinbox_dead_letters_total", 0)
    ]
);
window_test!(
    after_retention_expired,
    Window::AfterRetentionExpired,
    0,
    1,
    1,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_retention_purged_total", 1),
        ("txinbox_retention_expired_total", 1),
        ("txinbox_dead_letters_total", 1)
    ]
);
window_test!(
    shutdown_mid_flight,
    Window::ShutdownMidFlight,
    5,
    5,
    0,
    0,
    [
        ("txinbox_applied_total", 5),
        ("txinbox_interrupted_total", 2)
    ]
);
window_test!(
    external_call_answer_lost,
    Window::ExternalCallAnswerLost,
    1,
    1,
    0,
    0,
    [
        ("txinbox_effect_executions_total", 1),
        ("txinbox_effect_reconciliations_total", 1)
    ]
);
window_test!(
    external_call_no_idempotency,
    Window::ExternalCallAnswerLostNoIdempotency,
    1,
    1,
    0,
    0,
    [
        ("txinbox_effect_executions_total", 1),
        ("txinbox_effect_reconciliations_total", 1)
    ]
);
// The call never reached the destination (a gateway's 502) and the search answers 200 with an empty list:
// not found, called again, one task, done. Read as "done" by any-2xx, the effect would be done with no task.
window_test!(
    external_call_never_reached,
    Window::ExternalCallNeverReached,
    1,
    1,
    0,
    0,
    [
        ("txinbox_effect_executions_total", 2),
        ("txinbox_effect_reconciliations_total", 1)
    ]
);
// A slow destination following the IETF draft answers 409 to a key it is still processing: not final, never
// failed; done once it finishes, one task (the lab's own checks count the tasks and read the runner's story).
window_test!(
    external_call_key_in_progress,
    Window::ExternalCallKeyInProgress,
    1,
    1,
    0,
    0,
    [
        ("txinbox_applied_total", 1),
        ("txinbox_effect_executions_total", 2),
        ("txinbox_effect_reconciliations_total", 2)
    ]
);
