//! The FIFO dead-letter move as AWS documents it, injected in front of moto.
//!
//! AWS (SQS Developer Guide, dead-letter queue redrive): "When a message is moved from a FIFO queue to a FIFO
//! DLQ, the original message's deduplication ID will be replaced with the original message's ID." moto keeps
//! the producer's deduplication id on the move, so these tests put an SDK interceptor in front of it that
//! rewrites every message a `ReceiveMessage` on the DLQ returns the way AWS leaves it
//! (`MessageDeduplicationId` := `MessageId`). The message itself is really applied (PostgreSQL), really lost
//! its delete, and really moved to the DLQ by moto's `maxReceiveCount`.
//!
//! What must hold: the message already applied is never applied again, whatever way it comes back.
//!
//! Nothing here may hold only through a gap of moto's. In particular SQS keeps a deduplication id for five
//! minutes whatever becomes of its message (SendMessage, `MessageDeduplicationId`: "If a message with a
//! particular MessageDeduplicationId is sent successfully, any messages sent with the same
//! MessageDeduplicationId are accepted successfully but aren't delivered during the 5-minute deduplication
//! interval."; FIFO key terms: "Amazon SQS continues tracking the deduplication ID even after the message has
//! been received and deleted."), while moto forgets it once the message is deleted. So no test sends a
//! deduplication id twice to one queue within five minutes and expects the second copy; a copy that can only
//! come "after the window" goes to a fresh queue, where the id was never seen.

mod common;

use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aws_sdk_sqs::config::interceptors::{
    BeforeSerializationInterceptorContextRef, FinalizerInterceptorContextMut,
};
use aws_sdk_sqs::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_sdk_sqs::operation::receive_message::ReceiveMessageOutput;
use aws_sdk_sqs::operation::send_message::SendMessageInput;
use aws_sdk_sqs::types::MessageSystemAttributeName as S;
use common::*;
use serde_json::json;
use txinbox_core::{Delivery, Outcome, Receiver};
use txinbox_lab::faults::{crash_at, FaultPoint, Faults};
use txinbox_sqs::SqsReceiver;

/// Rewrites what `ReceiveMessage` returns as AWS's FIFO DLQ move leaves it. Install it only on a client that
/// receives from the DLQ.
#[derive(Debug)]
struct AwsFifoDlqMove;

impl Intercept for AwsFifoDlqMove {
    fn name(&self) -> &'static str {
        "AwsFifoDlqMove"
    }

    fn modify_before_attempt_completion(
        &self,
        context: &mut FinalizerInterceptorContextMut<'_>,
        _: &RuntimeComponents,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        let Some(Ok(output)) = context.output_or_error_mut() else {
            return Ok(());
        };
        let Some(out) = output.downcast_mut::<ReceiveMessageOutput>() else {
            return Ok(());
        };
        for m in out.messages.iter_mut().flatten() {
            // "the original message's deduplication ID will be replaced with the original message's ID"
            if let (Some(id), Some(attrs)) = (m.message_id.clone(), m.attributes.as_mut()) {
                attrs.insert(S::MessageDeduplicationId, id);
            }
        }
        Ok(())
    }
}

/// A client whose receives see the DLQ as AWS leaves it.
fn as_aws_leaves_the_dlq(c: &aws_sdk_sqs::Client) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::from_conf(c.config().to_builder().interceptor(AwsFifoDlqMove).build())
}

/// A `SendMessage`: the queue URL and the deduplication id.
type SendCall = (String, Option<String>);

/// Records every `SendMessage` a client makes.
#[derive(Debug, Default, Clone)]
struct Sends(Arc<Mutex<Vec<SendCall>>>);

impl Intercept for Sends {
    fn name(&self) -> &'static str {
        "Sends"
    }

    fn read_before_execution(
        &self,
        context: &BeforeSerializationInterceptorContextRef<'_>,
        _: &mut ConfigBag,
    ) -> Result<(), aws_sdk_sqs::error::BoxError> {
        if let Some(input) = context.input().downcast_ref::<SendMessageInput>() {
            self.0.lock().unwrap().push((
                input.queue_url().unwrap_or_default().to_owned(),
                input.message_deduplication_id().map(str::to_owned),
            ));
        }
        Ok(())
    }
}

/// The next delivery of `r` (within 20 s), else a panic saying `what` did not arrive.
async fn receive_one(r: &mut SqsReceiver, what: &str) -> txinbox_sqs::SqsDelivery {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "{what}");
        if let Some(d) = r.receive(1).await.unwrap().pop() {
            return d;
        }
    }
}

/// A message whose only identity is its deduplication id (no `ce-id`), applied by a consumer that opted into
/// that identity, whose delete is lost; moto's `maxReceiveCount` 1 then moves it to the DLQ. Returns the queues,
/// the store and the consumer name.
async fn applied_then_moved_to_the_dlq(
    c: &aws_sdk_sqs::Client,
) -> (Queues, txinbox_store::Store<sqlx::Postgres>, String) {
    let q = queue_pair(c, 1, 2).await;
    let store = pg_store().await;
    let consumer = unique("dlqmove");
    send(
        c,
        &q.url,
        &body("opp-42", "meeting-7", json!({})),
        None,
        "meeting-7-followup",
        "g1",
    )
    .await;
    let opts = fast_options(2, &q.dlq).deduplication_id_identity(true);
    let mut receiver = SqsReceiver::connect(c.clone(), &q.url, opts).await.unwrap();
    let d = receive_one(&mut receiver, "the message did not arrive").await;
    assert_eq!(
        d.message().producer_id.as_deref(),
        Some("meeting-7-followup"),
        "opted in: the deduplication id is the identity"
    );
    // Committed, then the process dies before the delete.
    let faults = Faults::new();
    let faulty = faulty_pg_inbox(&store, &consumer, &faults)
        .bind_handler(pg_handler(Arc::new(AtomicI64::new(0))));
    assert!(crash_at(&faulty, &faults, d, FaultPoint::AfterCommit)
        .await
        .is_err());
    assert_eq!(pg_effects(&store).await, 1, "applied once");
    // After the visibility timeout the next receive moves it to the DLQ (maxReceiveCount 1).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while total(c, &q.dlq).await < 1 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for the DLQ move"
        );
        assert!(receiver.receive(10).await.unwrap().is_empty());
    }
    (q, store, consumer)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn txinbox_redrive_leaves_a_dead_letter_whose_dedup_id_aws_replaced() {
    let c = client().await;
    let (q, store, _) = applied_then_moved_to_the_dlq(&c).await;
    let aws = as_aws_leaves_the_dlq(&c);
    // What a receive from the DLQ shows on AWS: the deduplication id is the message id.
    let seen = drain(&aws, &q.dlq).await;
    assert_eq!(seen.len(), 1);
    let sys = seen[0].attributes.as_ref().unwrap();
    assert_eq!(
        sys.get(&S::MessageDeduplicationId),
        seen[0].message_id.as_ref()
    );
    assert_eq!(
        txinbox_sqs::received_message(&seen[0], chrono::Utc::now()).producer_id,
        None,
        "a replaced deduplication id is never an identity"
    );
    c.change_message_visibility()
        .queue_url(&q.dlq)
        .receipt_handle(seen[0].receipt_handle().unwrap())
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();

    let report = redrive_back(&aws, &q, &mut ()).await;
    assert_eq!((report.moved, report.identity_lost), (0, 1), "{report:?}");
    assert_eq!(total(&c, &q.url).await, 0, "nothing sent back to the queue");
    assert_eq!(
        total(&c, &q.dlq).await,
        1,
        "the dead letter stays for an operator"
    );
    assert_eq!(pg_effects(&store).await, 1, "never applied again");
}

/// A dead letter left for its lost identity becomes visible again once its receive's visibility timeout
/// expires (AWS, ReceiveMessage's VisibilityTimeout: "If the message is not deleted or its visibility timeout is
/// not extended before the timeout expires, it becomes visible again and can be retrieved by other consumers."),
/// and a redrive pass longer than that timeout received it again: counted again on every receive, and the run
/// never ended while it kept coming back. It is now counted once and the run ends when only what it left comes
/// back. A visibility timeout of 0 puts every receive after the first past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redrive_longer_than_its_visibility_timeout_counts_a_lost_identity_once() {
    let c = client().await;
    let q = queue_pair(&c, 1, 2).await;
    send_without_ce_id(&c, &q.dlq, "lost").await;
    send_one_per_group(&c, &q.dlq, 0..2, "d-").await;
    let mut progress = ToldOnce::default();
    let report = redrive_back_past_visibility(&as_aws_leaves_the_dlq(&c), &q, &mut progress).await;
    let told = progress.0;
    assert_eq!(
        (report.moved, report.deferred, report.identity_lost),
        (2, 0, 1),
        "{report:?}"
    );
    assert_eq!(told.len(), 3, "each told once: {told:?}");
    assert_eq!(total(&c, &q.url).await, 2, "the two with ce-id moved");
    assert_eq!(total(&c, &q.dlq).await, 1, "the lost one stays");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_moved_back_as_start_message_move_task_does_is_not_applied_again() {
    let c = client().await;
    let (q, store, consumer) = applied_then_moved_to_the_dlq(&c).await;
    let aws = as_aws_leaves_the_dlq(&c);
    // SQS's own redrive (StartMessageMoveTask, which moto lacks) sends the DLQ copy back with its body,
    // attributes, group and the replaced deduplication id; the queue gives it a new MessageId.
    let seen = drain(&aws, &q.dlq).await;
    assert_eq!(seen.len(), 1);
    let m = &seen[0];
    let old_id = m.message_id().unwrap().to_owned();
    c.send_message()
        .queue_url(&q.url)
        .message_body(m.body().unwrap())
        .message_group_id("g1")
        .message_deduplication_id(&old_id)
        .send()
        .await
        .unwrap();
    c.delete_message()
        .queue_url(&q.dlq)
        .receipt_handle(m.receipt_handle().unwrap())
        .send()
        .await
        .unwrap();

    // 1. The default consumer: a deduplication id is not an identity, so the message has none. It is
    //    dead-lettered as bad input, not applied.
    let sends = Sends::default();
    let recorded =
        aws_sdk_sqs::Client::from_conf(c.config().to_builder().interceptor(sends.clone()).build());
    let mut receiver = fast_receiver(recorded, &q, 2).await;
    let calls = Arc::new(AtomicI64::new(0));
    let inbox = pg_inbox(&store, &consumer).bind_handler(pg_handler(calls.clone()));
    let d = receive_one(&mut receiver, "the moved copy did not arrive").await;
    assert_ne!(
        d.message().broker_id.as_deref(),
        Some(old_id.as_str()),
        "a new MessageId"
    );
    match inbox.process_one(d).await {
        Outcome::DeadLettered { reason, .. } => assert_eq!(reason, "no_identity"),
        other => panic!("expected no_identity, got {other:?}"),
    }
    assert_eq!(pg_effects(&store).await, 1, "not applied again");
    // Forwarded to the DLQ (the send was accepted), then deleted from the queue. What the DLQ then holds is not
    // asserted: the forward carries the copy's deduplication id, `old_id`, which is also the id AWS gave the
    // first dead letter when it moved it into that same DLQ a moment ago (the replacement exists for the DLQ's
    // own deduplication), so on AWS the forward may be accepted and not delivered (see the module docs); moto,
    // having forgotten the deleted dead letter's id, shows it.
    assert_eq!(
        *sends.0.lock().unwrap(),
        [(q.dlq.clone(), Some(old_id.clone()))],
        "one forward, to the DLQ, with the copy's deduplication id"
    );
    assert_eq!(total(&c, &q.url).await, 0, "the copy left the queue");

    // 2. A consumer that opted into the deduplication id sees a new identity (the old MessageId): only its
    //    business key stops it. That is the documented price of the opt-in.
    //
    //    The copy comes back (moved again from the DLQ) with the same deduplication id, `old_id`, which the
    //    queue saw in step 1: on SQS it is delivered only once the 5-minute deduplication interval has passed
    //    ("accepted successfully but aren't delivered during the 5-minute deduplication interval"; the id is
    //    tracked "even after the message has been received and deleted"). moto forgets the id on the delete, so
    //    a resend to `q.url` now would arrive on moto only. A fresh FIFO queue, where `old_id` was never seen,
    //    stands for the same queue after the interval.
    let later = queue_pair(&c, 1, 2).await;
    c.send_message()
        .queue_url(&later.url)
        .message_body(m.body().unwrap())
        .message_group_id("g1")
        .message_deduplication_id(&old_id)
        .send()
        .await
        .unwrap();
    let mut opted_in = SqsReceiver::connect(
        c.clone(),
        &later.url,
        fast_options(2, &later.dlq).deduplication_id_identity(true),
    )
    .await
    .unwrap();
    let d = receive_one(&mut opted_in, "the copy did not arrive after the window").await;
    assert_eq!(d.message().producer_id.as_deref(), Some(old_id.as_str()));
    match inbox.process_one(d).await {
        Outcome::BusinessDuplicate { .. } => {}
        other => panic!("expected the business key to catch it, got {other:?}"),
    }
    assert_eq!(pg_effects(&store).await, 1, "not applied again");
    assert_eq!(total(&c, &later.url).await, 0, "acknowledged");
}
