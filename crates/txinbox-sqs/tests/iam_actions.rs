//! The IAM actions the adapter declares ([`txinbox_sqs::iam`]) are the SQS operations a worker really calls:
//! every SDK call of a worker running against moto (connect, the start-up check, receive, heartbeat, ack,
//! dead-letter forward) is recorded by an SDK interceptor with the queue it targets, and checked against the declared
//! operations of that queue (the queue or its dead-letter queue) — and every declared operation is seen.
//! Needs moto (`eval "$(bash scripts/moto.sh start)"`) and PostgreSQL (`TXINBOX_TEST_PG_URL`).

mod common;

use std::collections::BTreeSet;
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::config::interceptors::BeforeTransmitInterceptorContextRef;
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::error::BoxError;
use common::*;
use serde_json::json;
use txinbox_core::{OutcomeKind, Receiver, Worker};
use txinbox_sqs::{iam, SqsOptions, SqsReceiver};

/// One SQS call: the operation (from the `X-Amz-Target` header of the JSON protocol) and the queue URL or
/// queue name in its body.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Call {
    operation: String,
    queue_url: Option<String>,
    queue_name: Option<String>,
}

#[derive(Debug, Default)]
struct Recorder(Mutex<Vec<Call>>);

#[derive(Debug)]
struct Recording(Arc<Recorder>);

impl Intercept for Recording {
    fn name(&self) -> &'static str {
        "txinbox-iam-recorder"
    }

    fn read_before_transmit(
        &self,
        context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        _cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let request = context.request();
        let target = request
            .headers()
            .get("x-amz-target")
            .ok_or("an SQS request without X-Amz-Target: not the JSON protocol")?;
        let operation = target
            .strip_prefix("AmazonSQS.")
            .ok_or_else(|| format!("unexpected X-Amz-Target {target}"))?
            .to_owned();
        let body: serde_json::Value =
            serde_json::from_slice(request.body().bytes().unwrap_or_default())?;
        let field = |k: &str| body.get(k).and_then(|v| v.as_str()).map(str::to_owned);
        self.0 .0.lock().unwrap().push(Call {
            operation,
            queue_url: field("QueueUrl"),
            queue_name: field("QueueName"),
        });
        Ok(())
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_call_a_worker_makes_is_a_declared_action_on_the_right_queue() {
    let plain = client().await;
    let q = queue_pair(&plain, 5, 3).await;
    let dlq_name = q.dlq.rsplit('/').next().unwrap().to_owned();

    // Applied, retried once then applied (release), slow (heartbeats), permanent (forward to the DLQ),
    // and several groups at once (deletes may batch).
    for (i, extra) in [
        json!({}),
        json!({"sleep_ms": 2500}),
        json!({"fail": "permanent"}),
    ]
    .into_iter()
    .enumerate()
    {
        send(
            &plain,
            &q.url,
            &body("o", &format!("m{i}"), extra),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            &format!("g{i}"),
        )
        .await;
    }
    for i in 3..10 {
        send(
            &plain,
            &q.url,
            &body("o", &format!("m{i}"), json!({})),
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            &format!("g{i}"),
        )
        .await;
    }

    let recorder = Arc::new(Recorder::default());
    let recorded = plain
        .config()
        .to_builder()
        .interceptor(Recording(recorder.clone()))
        .build();
    let c = aws_sdk_sqs::Client::from_conf(recorded);
    // No DLQ URL configured: connect resolves it from the queue's RedrivePolicy, as a worker from the
    // Terraform samples does.
    let opts = SqsOptions::default()
        .wait(Duration::from_secs(1))
        .visibility_timeout(Duration::from_secs(3));
    let mut receiver = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    assert_eq!(receiver.dead_letter_queue(), Some(q.dlq.as_str()));
    // The start-up check the example workers run before their first receive.
    receiver.check().await.unwrap();

    let store = pg_store().await;
    let consumer = unique("iam");
    let (stop, rx) = tokio::sync::oneshot::channel::<()>();
    let worker = tokio::spawn(
        Worker::new(
            receiver,
            pg_inbox(&store, &consumer).bind_handler(pg_handler(Arc::new(AtomicI64::new(0)))),
        )
        .run_until(async move {
            let _ = rx.await;
        }),
    );
    wait_until(Duration::from_secs(60), "all settled", || async {
        counts(&plain, &q.url).await == (0, 0) && counts(&plain, &q.dlq).await.0 == 1
    })
    .await;
    let _ = stop.send(());
    let report = worker.await.unwrap();
    assert_eq!(
        (
            report.count(OutcomeKind::Applied),
            report.count(OutcomeKind::DeadLettered)
        ),
        (9, 1),
        "{report:?}"
    );

    let calls = recorder.0.lock().unwrap().clone();
    let mut seen_queue = BTreeSet::new();
    let mut seen_dlq = BTreeSet::new();
    for call in &calls {
        let on_queue = call.queue_url.as_deref() == Some(q.url.as_str());
        let on_dlq = call.queue_url.as_deref() == Some(q.dlq.as_str())
            || call.queue_name.as_deref() == Some(dlq_name.as_str());
        let declared = if on_queue {
            seen_queue.insert(call.operation.clone());
            iam::QUEUE_OPERATIONS
                .iter()
                .find(|(op, _)| *op == call.operation)
        } else if on_dlq {
            seen_dlq.insert(call.operation.clone());
            iam::DLQ_OPERATIONS
                .iter()
                .find(|(op, _)| *op == call.operation)
        } else {
            panic!("a call on neither the queue nor its DLQ: {call:?}");
        };
        let (_, action) = declared.unwrap_or_else(|| {
            panic!(
                "{call:?} is not declared in txinbox_sqs::iam for the {}",
                if on_queue {
                    "queue"
                } else {
                    "dead-letter queue"
                }
            )
        });
        assert_eq!(iam::action_of(&call.operation), Some(*action));
        let actions: &[&str] = if on_queue {
            &iam::QUEUE_ACTIONS
        } else {
            &iam::DLQ_ACTIONS
        };
        assert!(actions.contains(action), "{action} is not declared");
    }

    // And the other way: each declared operation was exercised (the delete in one form or the other: the
    // adapter batches deletes that are ready together, which depends on timing).
    let deletes = ["DeleteMessage", "DeleteMessageBatch"];
    assert!(
        deletes.iter().any(|d| seen_queue.contains(*d)),
        "{seen_queue:?}"
    );
    for (op, _) in iam::QUEUE_OPERATIONS {
        if !deletes.contains(&op) {
            assert!(seen_queue.contains(op), "{op} never called: {seen_queue:?}");
        }
    }
    for (op, _) in iam::DLQ_OPERATIONS {
        assert!(seen_dlq.contains(op), "{op} never called: {seen_dlq:?}");
    }
    // Every action the queue needs was used (DeleteMessage covers DeleteMessageBatch).
    let used: BTreeSet<&str> = seen_queue
        .iter()
        .filter_map(|op| iam::action_of(op))
        .collect();
    assert_eq!(used, iam::QUEUE_ACTIONS.into_iter().collect());
}
