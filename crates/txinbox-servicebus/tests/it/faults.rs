//! The emulator's injected faults (throttling, 500, dropped answers) and the error mapping (401, 404, 410),
//! plus the Azure AD bearer path.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use txinbox_core::metrics as m;
use txinbox_core::{BrokerErrorKind, Delivery, Outcome, Receiver, Worker};
use txinbox_servicebus::{ServiceBusClient, ServiceBusConfig};

use crate::common::*;

const LOCK: Duration = Duration::from_secs(2);

/// The lock of most tests here: long enough for a retried settle to fit in it.
const LOCK_5S: Duration = Duration::from_secs(5);

/// The unique path suffix of a delivery's lock URI.
fn lock_suffix(q: &str, d: &txinbox_servicebus::ServiceBusDelivery) -> String {
    format!(
        "/{q}/messages/{}/{}",
        d.broker_properties().sequence_number.unwrap(),
        d.lock_token().unwrap()
    )
}

/// 429 and 503 on receive (with Retry-After) make failed receives the worker backs off from; nothing is lost.
#[tokio::test]
async fn throttled_receives_are_retried() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT2S"})).await;
    let store = pg().await;
    for i in 0..3 {
        publish(&client, &event(&q, &format!("evt-{i}"), "{}")).await;
    }
    let head = format!("/{q}/messages/head");
    emu.fault(json!({"kind": "status", "status": 429, "retry_after_seconds": 1, "method": "POST", "path_suffix": head, "count": 2}))
        .await;
    emu.fault(
        json!({"kind": "status", "status": 503, "method": "POST", "path_suffix": head, "count": 1}),
    )
    .await;

    let mut probe = fast_receiver(&client, &q, LOCK);
    let e = probe.receive(1).await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::Throttled, "{e:?}");
    assert!(e.is_retryable());

    let receiver = fast_receiver(&client, &q, LOCK);
    let opts =
        txinbox_core::WorkerOptions::default().receive_error_backoff(Duration::from_millis(100));
    let done = until(Duration::from_secs(30), || async {
        emu.counts(&q).await.0 == 0 && effects(&store).await.0 >= 3
    });
    let report = Worker::new(receiver, inbox(&store).bind_handler(Effects::default()))
        .options(opts)
        .run_until(async {
            done.await;
        })
        .await;
    assert_eq!(
        report.receive_errors, 2,
        "one 429 and one 503 left for the worker"
    );
    assert_eq!(report.count(txinbox_core::OutcomeKind::Applied), 3);
    assert_eq!(inbox_rows(&store).await, 3);
    assert_eq!(effects(&store).await, (3, 3));
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A 500 on complete is retried and the message is completed.
#[tokio::test]
async fn a_500_on_complete_is_retried() {
    let (_recorder, metrics) = Metrics::install();
    let store = pg().await;
    let Received { emu, q, d, .. } = publish_and_receive(LOCK_5S, "evt-500").await;
    emu.fault(json!({"kind": "status", "status": 500, "method": "DELETE", "path_suffix": lock_suffix(&q, &d), "count": 1}))
        .await;
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(
        metrics.counter(
            txinbox_servicebus::metrics::SETTLE_RETRIES,
            &[("op", "complete"), ("kind", "server_error")]
        ),
        1
    );
    assert_eq!(metrics.counter(m::SETTLE_FAILURES, &[]), 0);
    assert_eq!(emu.counts(&q).await, (0, 0));
    assert_eq!(effects(&store).await, (1, 1));
}

/// Throttled settles are retried while the lock lasts: a complete answered 429 twice, then completed; a renewal
/// answered 503 once, then renewed. Microsoft (`ServerBusyException`): "The exception that is thrown when a
/// server is busy. Callers should wait a while and retry the operation." Neither is a lost lock nor a failed
/// settle; each retry is counted by kind.
#[tokio::test]
async fn throttled_completes_and_renewals_are_retried() {
    let (_recorder, metrics) = Metrics::install();
    let store = pg().await;
    let Received { emu, q, d, .. } = publish_and_receive(LOCK_5S, "evt-busy").await;
    let lock = lock_suffix(&q, &d);

    emu.fault(json!({"kind": "status", "status": 503, "retry_after_seconds": 1, "method": "POST", "path_suffix": lock, "count": 1}))
        .await;
    let lease = d.lease().expect("a lease");
    let before = lease.expires_at().unwrap();
    let until = lease
        .renew(Duration::from_secs(5))
        .await
        .expect("renewed after a 503");
    assert!(until >= before, "{until} < {before}");
    drop(lease);

    emu.fault(json!({"kind": "status", "status": 429, "retry_after_seconds": 1, "method": "DELETE", "path_suffix": lock, "count": 2}))
        .await;
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");

    let retries = |op| {
        metrics.counter(
            txinbox_servicebus::metrics::SETTLE_RETRIES,
            &[("op", op), ("kind", "throttled")],
        )
    };
    assert_eq!(retries("renew-lock"), 1);
    assert_eq!(retries("complete"), 2);
    assert_eq!(metrics.counter(m::SETTLE_FAILURES, &[]), 0);
    assert_eq!(emu.counts(&q).await, (0, 0), "completed");
    assert_eq!(effects(&store).await, (1, 1));
}

/// A throttled complete is retried after the service's `Retry-After`, not after the adapter's own short
/// backoff (400 ms).
#[tokio::test]
async fn a_throttled_complete_waits_the_service_s_retry_after() {
    let Received { emu, q, d, .. } =
        publish_and_receive(Duration::from_secs(10), "evt-retry-after").await;
    emu.fault(json!({"kind": "status", "status": 503, "retry_after_seconds": 2, "method": "DELETE", "path_suffix": lock_suffix(&q, &d), "count": 1}))
        .await;
    let started = std::time::Instant::now();
    d.complete().await.expect("completed after the 503");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(2),
        "retried after {waited:?}, before the service's Retry-After of 2 s"
    );
    assert_eq!(emu.counts(&q).await, (0, 0), "completed");
}

/// A complete answered 503 with a `Retry-After` that ends less than a second before the lock does is not
/// retried: waiting would leave the worker idle for a retry that finds no lock (Microsoft, Peek-Lock Message:
/// "When the lock expires, the message becomes available to other receivers"). The settle fails at once as
/// throttled, with `error::SettleNotRetried` saying why; the message is not completed and comes back after
/// the lock, with its delivery counted.
#[tokio::test]
async fn a_retry_after_past_the_lock_is_not_waited() {
    let Received {
        emu,
        q,
        mut receiver,
        d,
        ..
    } = publish_and_receive(LOCK_5S, "evt-retry-after-past-lock").await;
    emu.fault(json!({"kind": "status", "status": 503, "retry_after_seconds": 4, "method": "DELETE", "path_suffix": lock_suffix(&q, &d), "count": 1}))
        .await;
    let e = d.complete().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::Throttled, "{e}");
    assert_eq!(e.retry_after(), Some(Duration::from_secs(4)));
    let not_retried = e
        .find_source::<txinbox_servicebus::error::SettleNotRetried>()
        .expect("the source says why the settle was not retried");
    assert_eq!(not_retried.attempt, 1);
    assert_eq!(not_retried.wait, Duration::from_secs(4));
    assert!(
        not_retried.wait + txinbox_servicebus::receiver::SETTLE_LOCK_MARGIN > not_retried.lock_left,
        "{not_retried}"
    );
    assert_eq!(emu.counts(&q).await, (1, 0), "not completed");
    let again = receiver
        .receive_one(Duration::from_secs(10))
        .await
        .unwrap()
        .expect("the message comes back after the lock");
    assert_eq!(
        again.message().producer_id.as_deref(),
        Some("evt-retry-after-past-lock")
    );
    assert_eq!(again.message().delivery_count, 2);
    again.complete().await.unwrap();
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A complete whose answer is lost, then refused (503) with a `Retry-After` past the lock, is given up as an
/// unknown outcome, not as throttled: the first attempt may have completed the message, and the 503 says
/// nothing about that.
#[tokio::test]
async fn a_complete_given_up_after_a_lost_answer_is_ambiguous() {
    let Received { emu, q, d, .. } = publish_and_receive(LOCK_5S, "evt-lost-then-throttled").await;
    let lock = lock_suffix(&q, &d);
    emu.fault(json!({"kind": "drop_response", "method": "DELETE", "path_suffix": lock}))
        .await;
    emu.fault(json!({"kind": "status", "status": 503, "retry_after_seconds": 4, "method": "DELETE", "path_suffix": lock}))
        .await;
    let e = d.complete().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown, "{e}");
    let ambiguous = e
        .find_source::<txinbox_servicebus::error::AmbiguousSettle>()
        .expect("the source says why the outcome is unknown");
    assert_eq!(ambiguous.attempt, 2);
    assert_eq!(ambiguous.earlier, BrokerErrorKind::OutcomeUnknown);
    assert_eq!(ambiguous.source.kind(), BrokerErrorKind::Throttled);
    assert!(e
        .find_source::<txinbox_servicebus::error::SettleNotRetried>()
        .is_some());
    assert_eq!(
        emu.counts(&q).await,
        (0, 0),
        "the first attempt completed it"
    );
}

/// An HTTP client in front of the emulator that passes the `BrokerProperties` of every answer through `edit`.
#[derive(Debug)]
struct EditBrokerProperties {
    http: reqwest::Client,
    edit: fn(&mut serde_json::Value),
}

#[async_trait::async_trait]
impl azure_core::HttpClient for EditBrokerProperties {
    async fn execute_request(
        &self,
        request: &azure_core::Request,
    ) -> azure_core::Result<azure_core::Response> {
        let (status, headers, body) = self.http.execute_request(request).await?.deconstruct();
        let mut out = azure_core::headers::Headers::new();
        for (name, value) in headers.iter() {
            let mut value = value.as_str().to_owned();
            if name.as_str().eq_ignore_ascii_case("brokerproperties") {
                let mut props: serde_json::Value = serde_json::from_str(&value).unwrap();
                (self.edit)(&mut props);
                value = props.to_string();
            }
            out.insert(name.clone(), value);
        }
        Ok(azure_core::Response::new(status, out, Box::pin(body)))
    }
}

/// A client on the emulator with the SAS rule, whose answers' `BrokerProperties` pass through `edit`.
fn client_editing(emu: &Emu, edit: fn(&mut serde_json::Value)) -> ServiceBusClient {
    ServiceBusConfig::shared_access_key(&emu.namespace, &emu.key_name, &emu.key)
        .endpoint(emu.url.parse().unwrap())
        .request_timeout(Duration::from_secs(5))
        .http_client(Arc::new(EditBrokerProperties {
            http: reqwest::Client::new(),
            edit,
        }))
        .connect()
        .unwrap()
}

/// Sets `EnqueuedSequenceNumber` to a value past `i32`, as an auto-forwarded message from a busy entity carries.
fn wide_enqueued_sequence(props: &mut serde_json::Value) {
    props["EnqueuedSequenceNumber"] = json!(3_000_000_000_i64);
}

/// A message whose `BrokerProperties` carries an `EnqueuedSequenceNumber` past `i32` is received, applied and
/// completed. Microsoft (`ServiceBusReceivedMessage.EnqueuedSequenceNumber`, a `long`): "For messages that have
/// been auto-forwarded, this property reflects the sequence number that had first been assigned to the message
/// at its original point of submission." The REST crate types it `i32`: its parse must not decide the receive.
#[tokio::test]
async fn an_enqueued_sequence_number_past_i32_is_received() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-wide", "{}")).await;
    let wide = client_editing(&emu, wide_enqueued_sequence);
    let d = receive_next(&mut fast_receiver(&wide, &q, LOCK_5S)).await;
    assert_eq!(
        d.broker_properties().enqueued_sequence_number,
        Some(3_000_000_000)
    );
    assert_eq!(d.message().producer_id.as_deref(), Some("evt-wide"));
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(emu.counts(&q).await, (0, 0), "completed");
}

/// Moves `LockedUntilUtc` an hour later than the emulator's: the service's clock ahead of ours.
fn service_clock_ahead(props: &mut serde_json::Value) {
    let until = props["LockedUntilUtc"].as_str().unwrap();
    let until = chrono::DateTime::parse_from_rfc2822(until).unwrap() + chrono::Duration::hours(1);
    props["LockedUntilUtc"] = json!(until.format("%a, %d %b %Y %H:%M:%S GMT").to_string());
}

/// The lock's end is never taken later than the queue's lock duration after the receive, whatever the
/// service's `LockedUntilUtc` says: that is the service's clock, and Microsoft's Peek-Lock guarantee is a
/// duration ("The message is guaranteed not to be delivered to other receivers (on the same queue or
/// subscription only) during the lock duration specified in the queue/subscription description."). With the
/// service's clock an hour ahead, the lease would otherwise report an hour of lock, and a release's hold or a
/// settle's retry wait past the real lock's end.
#[tokio::test]
async fn a_lock_end_from_a_clock_ahead_is_capped_by_the_lock_duration() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    publish(&client, &event(&q, "evt-clock-ahead", "{}")).await;
    let ahead = client_editing(&emu, service_clock_ahead);
    let d = receive_next(&mut fast_receiver(&ahead, &q, LOCK_5S)).await;
    let received = chrono::Utc::now();
    let most = received + chrono::Duration::seconds(5);
    assert!(d.locked_until() <= most, "{} > {most}", d.locked_until());
    let lease = d.lease().unwrap();
    assert!(lease.expires_at().unwrap() <= most);
    d.complete().await.expect("completed");
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// The complete takes effect but its answer is lost: the retry finds no lock and says the outcome is unknown
/// (not "lock lost"); the message is gone, the effect is there once.
#[tokio::test]
async fn a_dropped_complete_answer_is_ambiguous_and_harmless() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-drop", "{}")).await;
    publish(&client, &event(&q, "evt-drop-2", "{}")).await;
    let mut receiver = fast_receiver(&client, &q, LOCK_5S);

    let d = receive_next(&mut receiver).await;
    emu.fault(
        json!({"kind": "drop_response", "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}),
    )
    .await;
    let e = d.complete().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown, "{e}");

    let d = receive_next(&mut receiver).await;
    emu.fault(
        json!({"kind": "drop_response", "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}),
    )
    .await;
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(metrics.counter(m::SETTLE_FAILURES, &[("op", "ack")]), 1);
    assert_eq!(emu.counts(&q).await, (0, 0), "both completes took effect");
    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
}

/// The complete takes effect but is answered 500: the retry finds no lock (the first attempt removed the
/// message), so the outcome is unknown, not a lost lock. Through the inbox it is a failed settle, not a
/// conflict with a concurrent delivery; the message is gone and the effect is there once.
#[tokio::test]
async fn a_500_after_the_complete_applied_is_ambiguous_not_a_lost_lock() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-500-applied", "{}")).await;
    publish(&client, &event(&q, "evt-500-applied-2", "{}")).await;
    let mut receiver = fast_receiver(&client, &q, LOCK_5S);

    let d = receive_next(&mut receiver).await;
    emu.fault(json!({"kind": "apply_then_status", "status": 500, "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}))
        .await;
    let e = d.complete().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown, "{e}");
    let ambiguous = std::error::Error::source(&e)
        .and_then(|s| s.downcast_ref::<txinbox_servicebus::error::AmbiguousSettle>())
        .expect("the source says why the outcome is unknown");
    assert_eq!(ambiguous.attempt, 2);
    assert_eq!(ambiguous.earlier, BrokerErrorKind::ServerError);
    assert_eq!(ambiguous.source.kind(), BrokerErrorKind::LockLost);

    let d = receive_next(&mut receiver).await;
    emu.fault(json!({"kind": "apply_then_status", "status": 500, "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}))
        .await;
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(metrics.counter(m::SETTLE_FAILURES, &[("op", "ack")]), 1);
    assert_eq!(
        metrics.counter(m::CONCURRENT_CONFLICTS, &[]),
        0,
        "a 500 that applied is no concurrent delivery"
    );
    assert_eq!(emu.counts(&q).await, (0, 0), "both completes took effect");
    assert_eq!(inbox_rows(&store).await, 1);
    assert_eq!(effects(&store).await, (1, 1));
}

/// The complete takes effect but is answered 500, and its retry is refused (401, then 410 on another message):
/// the refusal is not retried, but the outcome is unknown, not a refusal of the complete: the first attempt
/// removed the message. Microsoft, Delete Message: "500 Internal error." says nothing of whether the message was
/// deleted; "401 Authorization failure." and "410 Specified queue or subscription doesn't exist." are about
/// the later request only.
#[tokio::test]
async fn a_refused_retry_after_a_500_that_applied_is_ambiguous() {
    for (refusal, kind) in [
        (401, BrokerErrorKind::Unauthorized),
        (410, BrokerErrorKind::EntityNotFound),
    ] {
        let Received { emu, q, d, .. } =
            publish_and_receive(LOCK_5S, &format!("evt-500-then-{refusal}")).await;
        let lock = lock_suffix(&q, &d);
        emu.fault(json!({"kind": "apply_then_status", "status": 500, "method": "DELETE", "path_suffix": lock}))
            .await;
        emu.fault(
            json!({"kind": "status", "status": refusal, "method": "DELETE", "path_suffix": lock}),
        )
        .await;
        let e = d.complete().await.unwrap_err();
        assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown, "{refusal}: {e}");
        let ambiguous = e
            .find_source::<txinbox_servicebus::error::AmbiguousSettle>()
            .expect("the source says why the outcome is unknown");
        assert_eq!(ambiguous.attempt, 2);
        assert_eq!(ambiguous.earlier, BrokerErrorKind::ServerError);
        assert_eq!(ambiguous.source.kind(), kind);
        assert_eq!(
            emu.counts(&q).await,
            (0, 0),
            "{refusal}: the first attempt completed it"
        );
    }
}

/// A local HTTP double of a namespace, one request per connection: a peek-lock on `/q/messages/head` answers
/// 201 with a message locked for a minute (`Location` `/q/messages/1/tok`); the lock URI answers every settle
/// and renewal with a redirect (303 to a DELETE, 302 to a POST) to `/q/done`, which answers 200 to anything.
/// Records `METHOD path` of each request.
fn redirecting_namespace() -> (String, Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (at, log) = (base.clone(), seen.clone());
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let head = String::from_utf8_lossy(&head).into_owned();
            let mut line = head.lines().next().unwrap_or_default().split(' ');
            let (method, target) = (
                line.next().unwrap_or_default(),
                line.next().unwrap_or_default(),
            );
            let path = target.split('?').next().unwrap_or_default().to_owned();
            log.lock().unwrap().push(format!("{method} {path}"));
            let until = (chrono::Utc::now() + chrono::Duration::seconds(60))
                .format("%a, %d %b %Y %H:%M:%S GMT");
            let answer = match (method, path.as_str()) {
                ("POST", "/q/messages/head") => format!(
                    "HTTP/1.1 201 Created\r\nBrokerProperties: {{\"DeliveryCount\":1,\"LockToken\":\"tok\",\"LockedUntilUtc\":\"{until}\",\"MessageId\":\"evt-redirect\",\"SequenceNumber\":1,\"State\":\"Active\",\"TimeToLive\":60}}\r\nLocation: {at}/q/messages/1/tok\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
                ),
                ("DELETE", "/q/messages/1/tok") => "HTTP/1.1 303 See Other\r\nLocation: /q/done\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
                ("POST", "/q/messages/1/tok") => "HTTP/1.1 302 Found\r\nLocation: /q/done\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
                (_, "/q/done") => "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
                _ => "HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\nConnection: close\r\n\r\n".to_owned(),
            };
            let _ = conn.write_all(answer.as_bytes());
        }
    });
    (base, seen)
}

/// A complete or a renewal answered with a redirect is not done: the HTTP client must not follow it (as a GET,
/// for a 303 to a DELETE or a 302 to a POST, or to another resource) and report the 200 that answers there as
/// the settle's. Microsoft lists the answers: Delete Message, "200 Message successfully deleted."; Renew-Lock
/// for a Message, "200 Message lock successfully renewed."; otherwise 401, 404, 410, 500; a redirect is none of
/// them, and what it leads to is not the lock URI.
#[tokio::test]
async fn a_settle_answered_with_a_redirect_is_not_reported_done() {
    let (base, seen) = redirecting_namespace();
    let client = ServiceBusConfig::shared_access_key("redirects", "listen", "c2VjcmV0")
        .endpoint(base.parse().unwrap())
        .request_timeout(Duration::from_secs(5))
        .connect()
        .unwrap();
    let mut receiver = fast_receiver(&client, "q", LOCK_5S);
    let d = receive_next(&mut receiver).await;
    let lease = d.lease().expect("a lease");
    let renewed = lease.renew(LOCK_5S).await;
    assert!(
        renewed.is_err(),
        "a redirected renewal reported done: {renewed:?}"
    );
    assert!(!renewed.unwrap_err().is_retryable());
    let completed = d.complete().await;
    assert!(completed.is_err(), "a redirected complete reported done");
    assert_eq!(
        *seen.lock().unwrap(),
        [
            "POST /q/messages/head",
            "POST /q/messages/1/tok",
            "DELETE /q/messages/1/tok"
        ],
        "no redirect followed"
    );
}

/// A complete whose only attempt (`settle_attempts(1)`) is answered 500 after it took effect is reported as an
/// unknown outcome, not as a server error to retry: Microsoft, Delete Message: "500 Internal error." says nothing
/// of whether the message was deleted, and here it was. Through the inbox it is a failed settle, not a
/// concurrent conflict; the message is gone and the effect is there once.
#[tokio::test]
async fn a_complete_s_last_attempt_answered_500_is_an_unknown_outcome() {
    let (_recorder, metrics) = Metrics::install();
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    let store = pg().await;
    publish(&client, &event(&q, "evt-lone-500", "{}")).await;
    publish(&client, &event(&q, "evt-lone-500-2", "{}")).await;
    let mut receiver = txinbox_servicebus::ServiceBusReceiver::new(
        &client,
        &q,
        fast_options(LOCK_5S).settle_attempts(1),
    )
    .unwrap();

    let d = receive_next(&mut receiver).await;
    emu.fault(json!({"kind": "apply_then_status", "status": 500, "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}))
        .await;
    let e = d.complete().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::OutcomeUnknown, "{e}");
    let given_up = e
        .find_source::<txinbox_servicebus::error::SettleMayHaveApplied>()
        .expect("the source says why the outcome is unknown");
    assert_eq!(given_up.attempt, 1);
    assert_eq!(given_up.source.kind(), BrokerErrorKind::ServerError);

    let d = receive_next(&mut receiver).await;
    emu.fault(json!({"kind": "apply_then_status", "status": 500, "method": "DELETE", "path_suffix": lock_suffix(&q, &d)}))
        .await;
    let outcome = inbox(&store).process(d, &Effects::default()).await;
    assert!(matches!(outcome, Outcome::Applied { .. }), "{outcome:?}");
    assert_eq!(metrics.counter(m::SETTLE_FAILURES, &[("op", "ack")]), 1);
    assert_eq!(metrics.counter(m::CONCURRENT_CONFLICTS, &[]), 0);
    assert_eq!(emu.counts(&q).await, (0, 0), "both completes took effect");
    assert_eq!(effects(&store).await, (1, 1));
}

/// A renewal whose answer is lost is retried, and the retry answered 404 is a lost lock, not an unknown
/// outcome: whatever the first renewal did, the 404 says there is no lock now. Microsoft, Renew-Lock for a
/// Message: "404 No message was found with the specified MessageId or LockToken."; and
/// `ServiceBusReceiver.RenewMessageLockAsync`: "The lock for the message has expired or the message has already
/// been completed. The Reason will be set to MessageLockLost in this case." (A complete's 404 after a lost
/// answer stays ambiguous: that complete may have removed the lock itself.)
#[tokio::test]
async fn a_renewal_s_404_after_a_lost_answer_is_a_lost_lock() {
    let Received { emu, q, d, .. } = publish_and_receive(LOCK_5S, "evt-renew-drop").await;
    let lock = lock_suffix(&q, &d);
    emu.fault(json!({"kind": "drop_response", "method": "POST", "path_suffix": lock}))
        .await;
    emu.fault(json!({"kind": "status", "status": 404, "method": "POST", "path_suffix": lock}))
        .await;
    let lease = d.lease().expect("a lease");
    let before = lease.expires_at().unwrap();
    let e = lease.renew(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::LockLost, "{e}");
    assert!(!e.is_retryable());
    assert!(
        e.find_source::<txinbox_servicebus::error::AmbiguousSettle>()
            .is_none(),
        "{e:?}"
    );
    assert_eq!(lease.expires_at().unwrap(), before, "no renewal is counted");
}

/// A receive answered 404 is a missing entity, not a lost lock: a receive holds no lock, and Microsoft's
/// Peek-Lock reference answers a missing entity with "410 Specified queue or subscription doesn't exist.", and
/// with "404 Subscription never existed." in its earlier version. The worker treats it as lasting (it gives
/// up after its limit), not as a lock lost by one message.
#[tokio::test]
async fn a_receive_answered_404_is_a_missing_entity() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT5S"})).await;
    emu.fault(json!({"kind": "status", "status": 404, "method": "POST", "path_suffix": format!("/{q}/messages/head")}))
        .await;
    let e = fast_receiver(&client, &q, LOCK_5S)
        .receive(1)
        .await
        .unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::EntityNotFound, "{e}");
    assert!(txinbox_core::runtime::worker::is_persistent_receive_error(
        e.kind()
    ));
}

/// 404 on a lapsed lock is LockLost, 410 on a missing queue EntityNotFound, 401 on a wrong key Unauthorized.
#[tokio::test]
async fn statuses_map_to_broker_errors() {
    let Received {
        emu, client, q, d, ..
    } = publish_and_receive(Duration::from_secs(1), "evt-lapse").await;
    assert_eq!(d.message().delivery_count, 1);
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let lease = d.lease().unwrap();
    assert_eq!(
        lease
            .renew(Duration::from_secs(1))
            .await
            .unwrap_err()
            .kind(),
        BrokerErrorKind::LockLost
    );
    assert_eq!(d.ack().await.unwrap_err().kind(), BrokerErrorKind::LockLost);

    let mut missing = fast_receiver(&client, "no-such-queue", LOCK);
    assert_eq!(
        missing.receive(1).await.unwrap_err().kind(),
        BrokerErrorKind::EntityNotFound
    );

    let mut refused = fast_receiver(&emu.wrong_key_client(), &q, LOCK);
    let e = refused.receive(1).await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::Unauthorized, "{e:?}");
    assert!(!e.to_string().contains(&emu.key));
}

#[derive(Debug)]
struct StaticToken(String);

#[async_trait::async_trait]
impl azure_core::auth::TokenCredential for StaticToken {
    async fn get_token(
        &self,
        scopes: &[&str],
    ) -> azure_core::Result<azure_core::auth::AccessToken> {
        assert_eq!(scopes, ["https://servicebus.azure.net/.default"]);
        Ok(azure_core::auth::AccessToken::new(
            self.0.clone(),
            azure_core::date::parse_rfc3339("2099-01-01T00:00:00Z")?,
        ))
    }
    async fn clear_cache(&self) -> azure_core::Result<()> {
        Ok(())
    }
}

/// A client on the emulator that signs with the Azure AD bearer `token`.
fn aad_client(emu: &Emu, token: &str) -> ServiceBusClient {
    ServiceBusConfig::token_credential(&emu.namespace, Arc::new(StaticToken(token.to_owned())))
        .endpoint(emu.url.parse().unwrap())
        .connect()
        .unwrap()
}

/// Azure AD: the bearer token of the configured credential replaces the crate's SAS.
#[tokio::test]
async fn azure_ad_bearer_tokens_are_sent() {
    let emu = Emu::shared().await;
    let q = emu.queue(json!({"lockDuration": "PT2S"})).await;
    let aad = aad_client(&emu, &emu.bearer);
    publish(&aad, &event(&q, "evt-aad", "{}")).await;
    let d = receive_next(&mut fast_receiver(&aad, &q, LOCK)).await;
    assert_eq!(d.message().producer_id.as_deref(), Some("evt-aad"));
    d.complete().await.unwrap();
    assert_eq!(emu.counts(&q).await, (0, 0));

    let mut refused = fast_receiver(&aad_client(&emu, "not-a-valid-token"), &q, LOCK);
    assert_eq!(
        refused.receive(1).await.unwrap_err().kind(),
        BrokerErrorKind::Unauthorized
    );
}
