//! What the adapter does with the `Failed` entries of a `DeleteMessageBatch` that answered 200. AWS
//! (`DeleteMessageBatch`): "Because the batch request can result in a combination of successful and
//! unsuccessful actions, you should check for batch errors even when the call returns an HTTP status code of
//! 200." and (`BatchResultErrorEntry.SenderFault`) "Specifies whether the error happened due to the caller of
//! the batch API action." moto does not fail batch entries on demand, so a transport in front of it answers the
//! batch itself: one entry whose receipt SQS no longer accepts (sender's fault), one SQS failed on its side.
//! The first is reported to its `ack` as a lost lock and not sent again (the message comes back and the inbox
//! absorbs it); the second is sent again alone with `DeleteMessage`, which moto performs; both are counted.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use txinbox_core::{BrokerErrorKind, Delivery, Receiver};
use txinbox_testkit::sdk_http::HttpRequest;

/// The operation (`X-Amz-Target` without its prefix) and receipt handles of every call that went out.
type Calls = Arc<Mutex<Vec<(String, Vec<String>)>>>;

/// Records `request` (its operation and receipt handles) in `calls`; returns its operation.
fn record(calls: &Calls, request: &HttpRequest) -> String {
    let op = operation(request).unwrap_or_default().to_owned();
    let body = json_body(request);
    let mut receipts: Vec<String> = Vec::new();
    if let Some(r) = body.get("ReceiptHandle").and_then(|v| v.as_str()) {
        receipts.push(r.to_owned());
    }
    for e in body
        .get("Entries")
        .and_then(|v| v.as_array())
        .into_iter()
        .flatten()
    {
        if let Some(r) = e.get("ReceiptHandle").and_then(|v| v.as_str()) {
            receipts.push(r.to_owned());
        }
    }
    calls.lock().unwrap().push((op.clone(), receipts));
    op
}

fn failing_batch_entries(c: &aws_sdk_sqs::Client, calls: Calls) -> aws_sdk_sqs::Client {
    let answer = serde_json::json!({
        "Successful": [],
        "Failed": [
            {"Id": "0", "Code": "ReceiptHandleIsInvalid", "SenderFault": true,
             "Message": "The input receipt handle is invalid."},
            {"Id": "1", "Code": "InternalError", "SenderFault": false,
             "Message": "We encountered an internal error. Please try again."}
        ]
    });
    answering_batches(c, calls, answer)
}

/// `c`, whose `DeleteMessageBatch` calls get `answer` (HTTP 200) instead of reaching moto; every other call
/// reaches moto. Records every call.
fn answering_batches(
    c: &aws_sdk_sqs::Client,
    calls: Calls,
    answer: serde_json::Value,
) -> aws_sdk_sqs::Client {
    answering(c, move |request| {
        (record(&calls, request) == "DeleteMessageBatch").then(|| json_answer(200, &answer))
    })
}

/// A current-thread runtime: both acks reach the deleter before it runs, so they go in one batch.
#[tokio::test]
async fn failed_batch_entries_are_reported_or_deleted_alone_by_their_fault() {
    metrics_init();
    let plain = client().await;
    let calls: Calls = Arc::default();
    let c = failing_batch_entries(&plain, calls.clone());
    let (acks, receipts, q) = ack_two_in_one_batch(&plain, c).await;
    let [a0, a1]: [_; 2] = acks.try_into().unwrap();
    let [h0, h1]: [_; 2] = receipts.try_into().unwrap();

    let e = a0.expect_err("an entry whose receipt SQS refused is not deleted");
    assert_eq!(e.kind(), BrokerErrorKind::LockLost, "{e}");
    a1.expect("an entry SQS failed on its side is deleted alone");
    assert_eq!(
        deletes(&calls),
        vec![
            ("DeleteMessageBatch".to_owned(), vec![h0, h1.clone()]),
            ("DeleteMessage".to_owned(), vec![h1]),
        ],
        "one batch, then the server's failure alone"
    );
    assert_eq!(
        counts(&plain, &q.url).await,
        (0, 1),
        "the refused one is still in flight, the other deleted"
    );
    let failures = |code| {
        counter(
            txinbox_sqs::metrics::DELETE_BATCH_ENTRY_FAILURES,
            &[("code", code)],
        )
    };
    assert_eq!(failures("ReceiptHandleIsInvalid"), 1);
    assert_eq!(failures("InternalError"), 1);
}

/// `c` (its SDK retries: three attempts), whose first `throttled` `DeleteMessageBatch` calls SQS refuses as a
/// whole with `RequestThrottled` (AWS, `DeleteMessageBatch` errors: "RequestThrottled: The request was denied
/// due to request throttling. [...] HTTP Status Code: 400"); the later ones, and every other call, reach moto.
fn throttled_batches(
    c: &aws_sdk_sqs::Client,
    calls: Calls,
    throttled: usize,
) -> aws_sdk_sqs::Client {
    let batches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let throttling = answering(c, move |request| {
        let refuse = record(&calls, request) == "DeleteMessageBatch"
            && batches.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < throttled;
        refuse.then(|| sqs_error(400, "RequestThrottled", "Rate exceeded"))
    });
    let retries = aws_sdk_sqs::config::retry::RetryConfig::standard()
        .with_max_attempts(3)
        .with_initial_backoff(Duration::from_millis(100));
    aws_sdk_sqs::Client::from_conf(
        throttling
            .config()
            .to_builder()
            .retry_config(retries)
            .build(),
    )
}

/// Receives the two messages `evt-t0`, `evt-t1` of a fresh queue pair through `c` and acks them together
/// (one batch); returns both acks' results, the two receipts, and the queue.
async fn ack_two_in_one_batch(
    plain: &aws_sdk_sqs::Client,
    c: aws_sdk_sqs::Client,
) -> (
    Vec<Result<(), txinbox_core::BrokerError>>,
    Vec<String>,
    Queues,
) {
    let q = queue_pair(plain, 5, 30).await;
    send(plain, &q.url, "{}", Some("evt-t0"), "d-t0", "g-0").await;
    send(plain, &q.url, "{}", Some("evt-t1"), "d-t1", "g-1").await;
    let mut r = fast_receiver(c, &q, 30).await;
    let mut got = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while got.len() < 2 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "received {}",
            got.len()
        );
        got.extend(r.receive(2 - got.len()).await.unwrap());
    }
    let d1 = got.pop().unwrap();
    let d0 = got.pop().unwrap();
    let receipts = vec![
        d0.receipt_handle().to_owned(),
        d1.receipt_handle().to_owned(),
    ];
    let (a0, a1) = tokio::join!(d0.ack(), d1.ack());
    (vec![a0, a1], receipts, q)
}

fn deletes(calls: &Calls) -> Vec<(String, Vec<String>)> {
    calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(op, _)| op.starts_with("DeleteMessage"))
        .cloned()
        .collect()
}

/// A `DeleteMessageBatch` refused as a whole because SQS throttles it is sent again as a batch (the SDK's
/// retries, with their backoff), never entry by entry: one `DeleteMessage` per entry would multiply the call
/// rate exactly when SQS asked for fewer calls. Once it is accepted, both acks succeed.
#[tokio::test]
async fn a_throttled_delete_batch_is_sent_again_as_a_batch() {
    let plain = client().await;
    let calls: Calls = Arc::default();
    let c = throttled_batches(&plain, calls.clone(), 1);
    let (acks, receipts, q) = ack_two_in_one_batch(&plain, c).await;
    for a in acks {
        a.expect("deleted by the batch sent again");
    }
    let batch = ("DeleteMessageBatch".to_owned(), receipts);
    assert_eq!(
        deletes(&calls),
        vec![batch.clone(), batch],
        "the refused batch, then the same batch again; no DeleteMessage"
    );
    assert_eq!(counts(&plain, &q.url).await, (0, 0));
}

/// A `DeleteMessageBatch` that SQS keeps refusing as a whole fails every entry's ack with the batch's error
/// (`Throttled`): none is reported done, since SQS deleted none, and none is sent again alone. The messages come
/// back after their visibility timeout and the inbox absorbs them.
#[tokio::test]
async fn a_delete_batch_refused_as_a_whole_fails_each_ack_without_single_deletes() {
    let plain = client().await;
    let calls: Calls = Arc::default();
    let c = throttled_batches(&plain, calls.clone(), usize::MAX);
    let (acks, receipts, q) = ack_two_in_one_batch(&plain, c).await;
    for a in acks {
        let e = a.expect_err("SQS deleted nothing");
        assert_eq!(e.kind(), BrokerErrorKind::Throttled, "{e}");
        assert_eq!(e.operation(), "DeleteMessageBatch");
    }
    let batch = ("DeleteMessageBatch".to_owned(), receipts);
    assert_eq!(
        deletes(&calls),
        vec![batch.clone(), batch.clone(), batch],
        "the SDK's three attempts of the batch, and no DeleteMessage"
    );
    assert_eq!(
        counts(&plain, &q.url).await,
        (0, 2),
        "both still in flight, to come back"
    );
}

/// An entry of a `DeleteMessageBatch` that answered 200 failed by the sender's fault with a code that is no
/// lost receipt (here `InvalidParameterValue` about another parameter): the same delete sent alone would be
/// refused the same way, so it is reported to its `ack` (`Rejected`) and not sent again; the entry reported
/// successful is done. AWS (`DeleteMessageBatch`): "The result of the action on each message is reported
/// individually in the response."
#[tokio::test]
async fn an_entry_refused_by_the_sender_s_fault_is_reported_not_sent_alone() {
    metrics_init();
    let plain = client().await;
    let calls: Calls = Arc::default();
    let answer = serde_json::json!({
        "Successful": [{"Id": "1"}],
        "Failed": [
            {"Id": "0", "Code": "InvalidParameterValue", "SenderFault": true,
             "Message": "Value for parameter Entries is invalid. Reason: refused."}
        ]
    });
    let c = answering_batches(&plain, calls.clone(), answer);
    let (acks, receipts, _q) = ack_two_in_one_batch(&plain, c).await;
    let mut acks = acks.into_iter();
    let e = acks
        .next()
        .unwrap()
        .expect_err("SQS refused the entry's delete");
    assert_eq!(e.kind(), BrokerErrorKind::Rejected, "{e}");
    acks.next()
        .unwrap()
        .expect("SQS reported the other entry deleted");
    assert_eq!(
        deletes(&calls),
        vec![("DeleteMessageBatch".to_owned(), receipts)],
        "the batch only; the refused entry is not sent again alone"
    );
    assert_eq!(
        counter(
            txinbox_sqs::metrics::DELETE_BATCH_ENTRY_FAILURES,
            &[("code", "InvalidParameterValue")]
        ),
        1
    );
}
