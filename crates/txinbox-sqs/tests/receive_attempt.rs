//! A FIFO receive whose answer is lost is retried with the same `ReceiveRequestAttemptId`. AWS
//! (`ReceiveMessage`, `ReceiveRequestAttemptId`): "If a networking issue occurs after a ReceiveMessage action,
//! and instead of a response you receive a generic error, it is possible to retry the same action with an
//! identical ReceiveRequestAttemptId to retrieve the same set of messages, even if their visibility timeout has
//! not yet expired." Without it the messages the lost answer brought stay in flight for their visibility
//! timeout, and their groups with them. moto ignores the parameter, so the test checks what the adapter sends:
//! a transport in front of moto forwards the first receive and drops its answer.

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use txinbox_core::Receiver;
use txinbox_sqs::SqsReceiver;
use txinbox_testkit::sdk_http::HttpRequest;

/// The `ReceiveRequestAttemptId` of every `ReceiveMessage` sent, in order.
type Attempts = Arc<Mutex<Vec<Option<String>>>>;

/// Whether `request` is the first `ReceiveMessage`; records the attempt id of every receive in `attempts`.
fn first_receive(request: &HttpRequest, attempts: &Attempts) -> bool {
    if operation(request) != Some("ReceiveMessage") {
        return false;
    }
    let id = json_body(request)
        .get("ReceiveRequestAttemptId")
        .and_then(|v| v.as_str())
        .map(str::to_owned);
    let mut a = attempts.lock().unwrap();
    a.push(id);
    a.len() == 1
}

/// `c`, whose first `ReceiveMessage` reaches moto and loses its answer; records every receive's attempt id.
fn first_receive_answer_lost(c: &aws_sdk_sqs::Client, attempts: Attempts) -> aws_sdk_sqs::Client {
    hooked(c, move |request, connector| {
        let first = first_receive(&request, &attempts);
        let connector = connector.clone();
        HttpConnectorFuture::new(async move {
            let answer = connector.call(request).await;
            if first {
                drop(answer);
                return Err(ConnectorError::io(
                    "connection reset after the request".into(),
                ));
            }
            answer
        })
    })
}

/// A receiver of `q` through `c` whose receives ask for one message.
async fn single_message_receiver(c: aws_sdk_sqs::Client, q: &Queues) -> SqsReceiver {
    SqsReceiver::connect(c, &q.url, fast_options(30, &q.dlq).batch_size(1))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fifo_receive_whose_answer_was_lost_is_retried_with_the_same_attempt_id() {
    let plain = client().await;
    let q = queue_pair(&plain, 5, 30).await;
    send(&plain, &q.url, "{}", Some("evt-lost-answer"), "d-1", "g-1").await;

    let attempts: Attempts = Arc::default();
    let c = first_receive_answer_lost(&plain, attempts.clone());
    let mut r = single_message_receiver(c, &q).await;
    let _ = tokio::time::timeout(Duration::from_secs(20), r.receive(1)).await;
    let _ = tokio::time::timeout(Duration::from_secs(20), r.receive(1)).await;

    let a = attempts.lock().unwrap().clone();
    assert!(
        a.len() >= 3,
        "the lost receive, its retry, a later receive: {a:?}"
    );
    assert!(
        a[0].is_some(),
        "a FIFO receive carries an attempt id: {a:?}"
    );
    assert_eq!(
        a[1], a[0],
        "the retry of a lost answer uses the lost attempt's id"
    );
    assert_ne!(a[2], a[0], "a new receive has a new attempt id: {a:?}");
}

/// A receive refused with `OverLimit` is `Throttled` (the worker backs off), and is not sent again with the
/// same attempt id: AWS (`ReceiveMessage`, errors): "OverLimit: The specified action violates a limit. For
/// example, ReceiveMessage returns this error if the maximum number of in flight messages is reached"
/// (120,000 on a standard queue, 20,000 on a FIFO queue). The next receive has a new id and gets the message.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_over_the_in_flight_limit_is_throttled_and_not_resent() {
    let plain = client().await;
    let q = queue_pair(&plain, 5, 30).await;
    send(&plain, &q.url, "{}", Some("evt-over-limit"), "d-1", "g-1").await;

    let attempts: Attempts = Arc::default();
    let seen = attempts.clone();
    let c = answering(&plain, move |request| {
        first_receive(request, &seen)
            .then(|| sqs_error(403, "OverLimit", "Too many messages in flight"))
    });
    let mut r = single_message_receiver(c, &q).await;

    let e = r.receive(1).await.expect_err("over the limit");
    assert_eq!(e.kind(), txinbox_core::BrokerErrorKind::Throttled, "{e}");
    assert_eq!(attempts.lock().unwrap().len(), 1, "not sent again");
    let got = r.receive(1).await.unwrap();
    assert_eq!(got.len(), 1, "the next receive gets the message");
    let a = attempts.lock().unwrap().clone();
    assert_ne!(a[1], a[0], "with a new attempt id: {a:?}");
}

/// A receive from an encrypted queue whose KMS key is disabled, answered as SQS answers it over the JSON
/// protocol (the query-compatible code in `x-amzn-query-error`, which aws-sdk-sqs reads as the error's code):
/// `Configuration`, a failure the worker counts as persistent (the key stays disabled until an operator acts),
/// not a `Rejected` request. AWS (`ReceiveMessage`, errors): "KmsDisabled: The request was denied due to request
/// throttling. HTTP Status Code: 400" (sic: the key is disabled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receive_refused_for_a_disabled_kms_key_is_a_configuration_error() {
    let plain = client().await;
    let q = queue_pair(&plain, 5, 30).await;
    let c = answering(&plain, |request| {
        (operation(request) == Some("ReceiveMessage")).then(|| {
            let mut response = sqs_error(
                400,
                "KmsDisabled",
                "The request was rejected because the specified key is not enabled.",
            );
            response
                .headers_mut()
                .insert("x-amzn-query-error", "KMS.DisabledException;Sender");
            response
        })
    });
    let mut r = single_message_receiver(c, &q).await;
    let e = r.receive(1).await.expect_err("the key is disabled");
    assert_eq!(
        e.kind(),
        txinbox_core::BrokerErrorKind::Configuration,
        "{e}"
    );
}
