//! Metrics and traces of the inbox: received, applied, retries, dead-letters, receive-to-commit latency, the
//! `txinbox.process` span, and the logs of repetition and collision.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txinbox::broker::Delivery;
use txinbox::mem::{MemoryQueue, QueueState};
use txinbox::sqlx;
use txinbox::{HandlerError, Message, Outcome, Raw, Tx};
use txinbox_e2e::{sqlite_store, MetricTotals};
use txinbox_lab::lab::{followup_business_key, lab_inbox, lab_message, task_handler};
use txinbox_lab::labdb::LabDb;

#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn metrics_spans_and_logs_tell_what_happened() {
    let (metrics, _guard) = MetricTotals::install_local();
    let logs = Logs::default();
    let w = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || w.clone())
        .with_ansi(false)
        .with_span_events(tracing_subscriber::fmt::format::FmtSpan::CLOSE)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _sub = tracing::subscriber::set_default(subscriber);

    let store = sqlite_store().await;
    <sqlx::Sqlite as LabDb>::create_tables(&store)
        .await
        .unwrap();
    let inbox = lab_inbox(store.clone()).retry_backoff(Duration::from_secs(5));
    let lab = inbox
        .clone()
        .bind_handler(task_handler::<txinbox::Store<sqlx::Sqlite>>())
        .business_key(followup_business_key);
    let q = MemoryQueue::default();

    // Applied, then a duplicate, then a collision.
    q.send(lab_message(0));
    q.send(lab_message(0));
    let mut altered = lab_message(0);
    altered.body =
        br#"{"opportunity":"oportunidade_2481","meeting":"reuniao_184","quantity":12}"#.to_vec();
    q.send(altered);
    for _ in 0..3 {
        let d = q.receive_now(1).pop().unwrap();
        lab.process_one(d).await;
    }

    // A retryable handler error: rolled back and released with the backoff, then redelivered.
    q.send(lab_message(1));
    let flaky = |_tx: Tx<sqlx::Sqlite>, _msg: Message<Raw>| async {
        Err::<(), _>(HandlerError::retry("CRM API timed out"))
    };
    let d = q.receive_now(1).pop().unwrap();
    assert!(matches!(
        inbox.process(d, &flaky).await,
        Outcome::Retry { .. }
    ));
    assert_eq!(q.state().delayed, 1, "released with a 5 s backoff");
    q.advance(Duration::from_secs(6));
    // A permanent one: dead-lettered with its reason.
    let broken = |_tx: Tx<sqlx::Sqlite>, _msg: Message<Raw>| async {
        Err::<(), _>(HandlerError::permanent("opportunity is closed"))
    };
    let d = q.receive_now(1).pop().unwrap();
    assert_eq!(d.message().delivery_count, 2);
    match inbox.process(d, &broken).await {
        Outcome::DeadLettered { reason, detail } => {
            assert_eq!(reason, "handler_permanent");
            assert!(detail.contains("opportunity is closed"));
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        q.state(),
        QueueState {
            dead_lettered: 2,
            ..QueueState::default()
        }
    );

    assert_eq!(
        metrics.counter("txinbox_received_total", &[("consumer", "crm-followup")]),
        5
    );
    assert_eq!(metrics.counter("txinbox_applied_total", &[]), 1);
    assert_eq!(metrics.counter("txinbox_duplicates_total", &[]), 1);
    assert_eq!(metrics.counter("txinbox_payload_collisions_total", &[]), 1);
    assert_eq!(
        metrics.counter("txinbox_retries_total", &[("reason", "handler")]),
        1
    );
    assert_eq!(
        metrics.counter(
            "txinbox_dead_letters_total",
            &[("reason", "payload_collision")]
        ),
        1
    );
    assert_eq!(
        metrics.counter(
            "txinbox_dead_letters_total",
            &[("reason", "handler_permanent")]
        ),
        1
    );
    assert_eq!(
        metrics.histogram_samples("txinbox_receive_to_commit_seconds"),
        1
    );

    // A span closes when its last handle goes: a task the database driver spawned while it was current (the
    // connection going back to the pool) may hold it a moment longer. Let those tasks run (bounded).
    for _ in 0..100 {
        if logs.text().matches("close time.busy").count() >= 5 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let text = logs.text();
    let closed: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("close time.busy"))
        .collect();
    assert_eq!(closed.len(), 5, "one span per delivery:\n{text}");
    assert!(
        closed
            .iter()
            .all(|l| l.contains("txinbox.process{consumer=crm-followup")),
        "{text}"
    );
    assert!(
        text.contains("outcome=\"applied\"") || text.contains("outcome=applied"),
        "{text}"
    );
    assert!(
        text.contains("duplicate: already applied, no effect"),
        "{text}"
    );
    assert!(text.contains("payload collision"), "{text}");
    assert!(text.contains("message_id=evt-482"), "{text}");
}
