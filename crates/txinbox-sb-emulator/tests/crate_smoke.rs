//! Smoke test with the real client crate `azure_messaging_servicebus` 0.21: it signs its own SAS
//! tokens and parses our responses. Its URLs name `https://{ns}.servicebus.windows.net`, so an
//! `azure_core::HttpClient` wrapper rewrites them to the emulator after signing.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use azure_core::{HttpClient, Request, Response, StatusCode};
use azure_messaging_servicebus::prelude::QueueClient;
use azure_messaging_servicebus::service_bus::{SendMessageOptions, SettableBrokerProperties};
use common::{KEY, KEY_NAME, NAMESPACE};
use txinbox_sb_emulator::{Emulator, QueueProperties, RequestCounts};

/// Sends every request for the namespace host to the emulator instead.
#[derive(Debug)]
struct Loopback {
    inner: Arc<dyn HttpClient>,
    public_host: String,
    port: u16,
}

#[async_trait::async_trait]
impl HttpClient for Loopback {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<Response> {
        let mut request = request.clone();
        let url = request.url_mut();
        if url.host_str() == Some(self.public_host.as_str()) {
            url.set_scheme("http").expect("https → http is allowed");
            url.set_host(Some("127.0.0.1")).expect("valid host");
            url.set_port(Some(self.port)).expect("port can be set");
        }
        self.inner.execute_request(&request).await
    }
}

/// The crate's HTTP client, pointed at `emulator`.
fn loopback(emulator: &txinbox_sb_emulator::EmulatorHandle) -> Arc<dyn HttpClient> {
    Arc::new(Loopback {
        inner: azure_core::new_http_client(),
        public_host: emulator.namespace_host().to_string(),
        port: emulator.addr().port(),
    })
}

#[tokio::test]
async fn the_crate_sends_peek_locks_and_deletes() {
    let emulator =
        common::start_with(Emulator::builder().queue("orders", QueueProperties::default())).await;
    let http = loopback(&emulator);
    let client =
        QueueClient::new(http.clone(), NAMESPACE, "orders", KEY_NAME, KEY).expect("client");

    let options = SendMessageOptions {
        content_type: Some("text/plain".into()),
        broker_properties: Some(SettableBrokerProperties {
            message_id: Some("msg-1".into()),
            label: Some("M1".into()),
            time_to_live: Some(Duration::from_millis(90_500)),
            ..SettableBrokerProperties::default()
        }),
        custom_properties: Some(HashMap::from([(
            "Priority".to_string(),
            "\"High\"".to_string(),
        )])),
    };
    client
        .send_message("hello from the crate", Some(options))
        .await
        .expect("send accepted (SAS verified)");

    let received = client
        .peek_lock_message2(Some(Duration::from_secs(5)))
        .await
        .expect("peek-lock");
    assert_eq!(*received.status(), StatusCode::Created);
    assert_eq!(received.body(), "hello from the crate");
    let props = received
        .broker_properties()
        .expect("the crate parses BrokerProperties");
    assert_eq!(props.message_id, "msg-1");
    assert_eq!(props.delivery_count, 1);
    assert_eq!(props.sequence_number, 1);
    assert_eq!(props.enqueued_sequence_number, Some(0));
    assert_eq!(props.state, "Active");
    assert!((props.time_to_live - 90.5).abs() < 1e-9);
    assert!(!props.lock_token.is_empty());
    let state = emulator.queue_state("orders").expect("queue");
    assert_eq!(state.locked_message_count, 1);
    assert_eq!(state.messages[0].properties["priority"], "High");

    received.renew_message_lock().await.expect("renew");
    received
        .delete_message()
        .await
        .expect("delete via the Location lock URI");
    let state = emulator.queue_state("orders").expect("queue");
    assert_eq!(state.active_message_count, 0);

    // A lost lock surfaces as a 404 the adapter can see.
    let error = received
        .delete_message()
        .await
        .expect_err("lock already used");
    assert!(
        matches!(
            error.kind(),
            azure_core::error::ErrorKind::HttpResponse {
                status: StatusCode::NotFound,
                ..
            }
        ),
        "{error:?}"
    );

    // A wrong key is refused by our SAS check.
    let wrong = QueueClient::new(http, NAMESPACE, "orders", KEY_NAME, "wrong-key").expect("client");
    let refused = wrong.send_message("x", None).await.expect_err("401");
    assert!(
        matches!(
            refused.kind(),
            azure_core::error::ErrorKind::HttpResponse {
                status: StatusCode::Unauthorized,
                ..
            }
        ),
        "{refused:?}"
    );
}

/// A message put from this process (`send_message`, no request) is received as any other; every data-plane
/// request the crate sends is counted by operation (what the benchmark divides by the messages it moved); a
/// refused put says why.
#[tokio::test]
async fn messages_put_in_process_are_received_and_requests_are_counted() {
    let emulator =
        common::start_with(Emulator::builder().queue("orders", QueueProperties::default())).await;
    let http = loopback(&emulator);
    let client = QueueClient::new(http, NAMESPACE, "orders", KEY_NAME, KEY).expect("client");
    assert_eq!(emulator.request_counts(), RequestCounts::default());
    emulator
        .send_message("orders", "put-1", "{\"a\":1}")
        .expect("put");
    assert_eq!(emulator.request_counts().sends, 0, "a put is not a request");
    let received = client
        .peek_lock_message2(Some(Duration::from_secs(5)))
        .await
        .expect("peek-lock");
    assert_eq!(*received.status(), StatusCode::Created);
    assert_eq!(received.body(), "{\"a\":1}");
    let props = received.broker_properties().expect("BrokerProperties");
    assert_eq!(props.message_id, "put-1");
    received.renew_message_lock().await.expect("renew");
    received.delete_message().await.expect("complete");
    // An empty queue: the receive answers 204 and is counted all the same.
    let empty = client
        .peek_lock_message2(Some(Duration::ZERO))
        .await
        .expect("peek-lock");
    assert_eq!(*empty.status(), StatusCode::NoContent);
    client.send_message("sent", None).await.expect("send");
    let counts = emulator.request_counts();
    assert_eq!(
        (
            counts.sends,
            counts.peek_locks,
            counts.completes,
            counts.renewals,
            counts.abandons,
            counts.receive_and_deletes
        ),
        (1, 2, 1, 1, 0, 0),
        "{counts:?}"
    );
    let refused = emulator
        .send_message("no-such-queue", "x", "{}")
        .expect_err("no queue");
    assert!(refused.to_string().contains("no-such-queue"), "{refused}");
}

/// A delay fault holds each matching request back at least its delay, and the counts say how many requests
/// were held back and for how long in all: the round trip a benchmark really measured at.
#[tokio::test]
async fn delayed_requests_are_counted_with_the_delay_they_got() {
    let emulator =
        common::start_with(Emulator::builder().queue("orders", QueueProperties::default())).await;
    let http = loopback(&emulator);
    let client = QueueClient::new(http, NAMESPACE, "orders", KEY_NAME, KEY).expect("client");
    emulator
        .inject_fault(txinbox_sb_emulator::FaultRule::delay(20).count(3))
        .expect("fault");
    for _ in 0..4 {
        let started = std::time::Instant::now();
        client.send_message("m", None).await.expect("send");
        let took = started.elapsed();
        let counts = emulator.request_counts();
        if counts.sends <= 3 {
            assert!(
                took >= Duration::from_millis(20),
                "a delayed send took {took:?}"
            );
        }
    }
    let counts = emulator.request_counts();
    assert_eq!((counts.sends, counts.delays), (4, 3), "{counts:?}");
    assert!(
        counts.delay_micros >= 3 * 20_000,
        "three delays of 20 ms lasted {} µs in all",
        counts.delay_micros
    );
}
