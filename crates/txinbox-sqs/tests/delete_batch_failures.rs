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
use txinbox_sqs::SqsReceiver;
use txinbox_testkit::sdk_http::{with_hook, HttpConnector, HttpConnectorFuture};

/// The operation (`X-Amz-Target` without its prefix) and receipt handles of every call that went out.
type Calls = Arc<Mutex<Vec<(String, Vec<String>)>>>;

fn failing_batch_entries(c: &aws_sdk_sqs::Client, calls: Calls) -> aws_sdk_sqs::Client {
    let inner = c.config().http_client().expect("an HTTP client");
    let http = with_hook(inner, move |request, connector| {
        let op = request
            .headers()
            .get("x-amz-target")
            .unwrap_or_default()
            .trim_start_matches("AmazonSQS.")
            .to_owned();
        let body: serde_json::Value =
            serde_json::from_slice(request.body().bytes().unwrap_or_default()).unwrap_or_default();
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
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            if op != "DeleteMessageBatch" {
                return connector.call(request).await;
            }
            let answer = serde_json::json!({
                "Successful": [],
                "Failed": [
                    {"Id": "0", "Code": "ReceiptHandleIsInvalid", "SenderFault": true,
                     "Message": "The input receipt handle is invalid."},
                    {"Id": "1", "Code": "InternalError", "SenderFault": false,
                     "Message": "We encountered an internal error. Please try again."}
                ]
            })
            .to_string();
            let mut response = aws_sdk_sqs::config::http::HttpResponse::new(
                200u16.try_into().expect("a status"),
                answer.into(),
            );
            response
                .headers_mut()
                .insert("content-type", "application/x-amz-json-1.0");
            Ok(response)
        })
    });
    aws_sdk_sqs::Client::from_conf(c.config().to_builder().http_client(http).build())
}

/// A current-thread runtime: both acks reach the deleter before it runs, so they go in one batch.
#[tokio::test]
async fn failed_batch_entries_are_reported_or_deleted_alone_by_their_fault() {
    metrics_init();
    let plain = client().await;
    let q = queue_pair(&plain, 5, 30).await;
    send(&plain, &q.url, "{}", Some("evt-b0"), "d-b0", "g-0").await;
    send(&plain, &q.url, "{}", Some("evt-b1"), "d-b1", "g-1").await;

    let calls: Calls = Arc::default();
    let c = failing_batch_entries(&plain, calls.clone());
    let opts = fast_options(30, &q.dlq);
    let mut r = SqsReceiver::connect(c, &q.url, opts).await.unwrap();
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
    let (h0, h1) = (
        d0.receipt_handle().to_owned(),
        d1.receipt_handle().to_owned(),
    );

    let (a0, a1) = tokio::join!(d0.ack(), d1.ack());

    let e = a0.expect_err("an entry whose receipt SQS refused is not deleted");
    assert_eq!(e.kind(), BrokerErrorKind::LockLost, "{e}");
    a1.expect("an entry SQS failed on its side is deleted alone");
    let deletes: Vec<(String, Vec<String>)> = calls
        .lock()
        .unwrap()
        .iter()
        .filter(|(op, _)| op.starts_with("DeleteMessage"))
        .cloned()
        .collect();
    assert_eq!(
        deletes,
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
