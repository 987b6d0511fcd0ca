//! The data plane over plain HTTP, with requests shaped like Microsoft's documented examples and
//! the documented status codes, headers and formats.

mod common;

use common::{Client, NAMESPACE};
use reqwest::{Method, StatusCode};
use serde_json::Value;

/// [doc SEND] example: custom properties as headers, BrokerProperties JSON, 201.
/// [doc PEEK] example: 201, BrokerProperties with every documented field, Location with the
/// sequence number and lock token, custom properties quoted, Content-Type echoed.
#[tokio::test]
async fn send_then_peek_lock_like_the_documented_examples() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("HttpClientSampleQueue", "").await;

    let sent = client
        .call(
            Method::POST,
            "/HttpClientSampleQueue/messages?timeout=60",
            &[
                (
                    "BrokerProperties",
                    r#"{"Label":"M1","State":"Active","TimeToLive":10}"#,
                ),
                ("Priority", "High"),
                ("Customer", "12345,ABC"),
                (
                    "Content-Type",
                    "application/atom+xml;type=entry;charset=utf-8",
                ),
            ],
            "This is a message.",
        )
        .await;
    assert_eq!(sent.status, StatusCode::CREATED, "{}", sent.body);

    let got = client.peek_lock("HttpClientSampleQueue", 60).await;
    assert_eq!(got.status, StatusCode::CREATED, "{}", got.body);
    assert_eq!(got.body, "This is a message.");
    assert_eq!(
        got.header("content-type"),
        Some("application/atom+xml;type=entry;charset=utf-8")
    );
    assert_eq!(got.header("priority"), Some("\"High\""));
    assert_eq!(got.header("customer"), Some("\"12345,ABC\""));

    let props = got.broker_properties();
    assert_eq!(props["DeliveryCount"], 1);
    assert_eq!(props["EnqueuedSequenceNumber"], 0);
    assert_eq!(props["Label"], "M1");
    assert_eq!(props["SequenceNumber"], 1);
    assert_eq!(props["State"], "Active");
    assert_eq!(props["TimeToLive"], 10.0);
    let message_id = props["MessageId"].as_str().expect("MessageId string");
    assert_eq!(
        message_id.len(),
        32,
        "service-generated MessageId: 32 hex digits"
    );
    assert!(message_id.bytes().all(|b| b.is_ascii_hexdigit()));
    let lock_token = props["LockToken"].as_str().expect("LockToken string");
    assert_eq!(lock_token.len(), 36);
    for date in ["EnqueuedTimeUtc", "LockedUntilUtc"] {
        let text = props[date].as_str().expect("date string");
        assert!(text.ends_with(" GMT"), "{date} = {text}");
        assert!(
            chrono::DateTime::parse_from_rfc2822(text).is_ok(),
            "{date} = {text}"
        );
    }
    // Absolute URL, entity path lower-cased, sequence number then lock token [doc PEEK].
    let location = got.header("location").expect("Location");
    assert_eq!(
        location,
        format!("https://{NAMESPACE}.servicebus.windows.net/httpclientsamplequeue/messages/1/{lock_token}")
    );

    let done = client.call(Method::DELETE, &got.lock_path(), &[], "").await;
    assert_eq!(done.status, StatusCode::OK);
    assert_eq!(
        client.state("HttpClientSampleQueue").await["activeMessageCount"],
        0
    );
}

/// [doc RAD]: 200 (not 201), no LockToken/LockedUntilUtc, no Location; the message is gone.
#[tokio::test]
async fn receive_and_delete_answers_200_without_a_lock() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("orders", "").await;
    client
        .send(
            "orders",
            "hello",
            r#"{"MessageId":"m-1","CorrelationId":"c-1"}"#,
        )
        .await;

    let got = client
        .call(Method::DELETE, "/orders/messages/head?timeout=60", &[], "")
        .await;
    assert_eq!(got.status, StatusCode::OK);
    assert_eq!(got.body, "hello");
    let props = got.broker_properties();
    assert_eq!(props["MessageId"], "m-1");
    assert_eq!(props["CorrelationId"], "c-1");
    assert_eq!(props["DeliveryCount"], 1);
    assert!(props.get("LockToken").is_none());
    assert!(props.get("LockedUntilUtc").is_none());
    assert!(got.header("location").is_none());

    let empty = client
        .call(Method::DELETE, "/orders/messages/head?timeout=0", &[], "")
        .await;
    assert_eq!(empty.status, StatusCode::NO_CONTENT);
    assert!(empty.body.is_empty());
}

/// [doc PEEK]: 204 when no message arrives within the timeout; a waiting receive wakes when a
/// message is sent.
#[tokio::test]
async fn long_polling_answers_204_or_wakes_on_send() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("orders", "").await;

    let empty = client.peek_lock("orders", 1).await;
    assert_eq!(empty.status, StatusCode::NO_CONTENT);
    assert!(empty.header("brokerproperties").is_none());

    let waiting = tokio::spawn({
        let client = Client::new(&emulator);
        async move { client.peek_lock("orders", 60).await }
    });
    // Send once the receive is waiting (the state shows nothing to receive until then).
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        client.send("orders", "late", "{}").await.status,
        StatusCode::CREATED
    );
    let got = waiting.await.expect("receiver task");
    assert_eq!(got.status, StatusCode::CREATED);
    assert_eq!(got.body, "late");
}

/// [doc UNLOCK]: abandon answers 200 and the message comes back with DeliveryCount 2 [doc DLQ];
/// [doc DEL]: a used lock token answers 404 afterwards.
#[tokio::test]
async fn abandon_raises_the_delivery_count_and_old_locks_are_404() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("orders", "").await;
    client.send("orders", "x", r#"{"MessageId":"m-1"}"#).await;

    let first = client.peek_lock("orders", 5).await;
    let abandon = client.call(Method::PUT, &first.lock_path(), &[], "").await;
    assert_eq!(abandon.status, StatusCode::OK);
    assert_eq!(
        client
            .call(Method::PUT, &first.lock_path(), &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    let second = client.peek_lock("orders", 5).await;
    assert_eq!(second.broker_properties()["DeliveryCount"], 2);
    assert_ne!(
        second.broker_properties()["LockToken"],
        first.broker_properties()["LockToken"]
    );
    assert_eq!(
        client
            .call(Method::DELETE, &first.lock_path(), &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );

    // The lock URI may name the MessageId instead of the sequence number [doc DEL].
    let token = second.broker_properties()["LockToken"]
        .as_str()
        .expect("token")
        .to_string();
    let by_id = client
        .call(
            Method::DELETE,
            &format!("/orders/messages/m-1/{token}"),
            &[],
            "",
        )
        .await;
    assert_eq!(by_id.status, StatusCode::OK);
    assert_eq!(
        client
            .call(
                Method::DELETE,
                &format!("/orders/messages/m-1/{token}"),
                &[],
                ""
            )
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .call(Method::DELETE, "/orders/messages/1/not-a-guid", &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

/// [doc RENEW]: 200 with no body; the lock holds past its first expiry. A lapsed lock answers 404
/// and the message is delivered again with a higher DeliveryCount [doc DLQ, LOCKS].
#[tokio::test]
async fn renew_extends_the_lock_and_lapsed_locks_are_404() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client
        .create_queue("orders", r#"{"lockDuration":"PT1.5S"}"#)
        .await;
    client.send("orders", "x", "{}").await;

    let got = client.peek_lock("orders", 5).await;
    let renew = client.call(Method::POST, &got.lock_path(), &[], "").await;
    assert_eq!(renew.status, StatusCode::OK);
    assert!(renew.body.is_empty());
    let state = client.state("orders").await;
    assert_eq!(state["lockedMessageCount"], 1);
    assert_eq!(state["properties"]["lockDuration"], "PT1.5S");

    // Long-poll until the lock lapses and the message comes back.
    let again = client.peek_lock("orders", 30).await;
    assert_eq!(again.status, StatusCode::CREATED);
    assert_eq!(again.broker_properties()["DeliveryCount"], 2);
    assert_eq!(
        client
            .call(Method::POST, &got.lock_path(), &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .call(Method::DELETE, &got.lock_path(), &[], "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .call(Method::DELETE, &again.lock_path(), &[], "")
            .await
            .status,
        StatusCode::OK
    );
}

/// [doc DLQ]: past MaxDeliveryCount the message moves to `$DeadLetterQueue` with
/// `DeadLetterReason: MaxDeliveryCountExceeded`, which arrives as a custom-property header.
#[tokio::test]
async fn max_delivery_count_dead_letters_and_the_dlq_is_receivable() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client
        .create_queue("orders", r#"{"maxDeliveryCount":2}"#)
        .await;
    client
        .send("orders", "poison", r#"{"MessageId":"p-1"}"#)
        .await;

    for expected_count in 1..=2 {
        let got = client.peek_lock("orders", 5).await;
        assert_eq!(got.broker_properties()["DeliveryCount"], expected_count);
        assert_eq!(
            client
                .call(Method::PUT, &got.lock_path(), &[], "")
                .await
                .status,
            StatusCode::OK
        );
    }
    assert_eq!(
        client.peek_lock("orders", 0).await.status,
        StatusCode::NO_CONTENT
    );
    let state = client.state("orders").await;
    assert_eq!(state["activeMessageCount"], 0);
    assert_eq!(state["deadLetterMessageCount"], 1);
    assert_eq!(
        state["deadLetterMessages"][0]["deadLetterReason"],
        "MaxDeliveryCountExceeded"
    );

    let dead = client.peek_lock("orders/$DeadLetterQueue", 5).await;
    assert_eq!(dead.status, StatusCode::CREATED);
    assert_eq!(dead.body, "poison");
    assert_eq!(dead.broker_properties()["MessageId"], "p-1");
    assert_eq!(
        dead.header("deadletterreason"),
        Some("\"MaxDeliveryCountExceeded\"")
    );
    assert!(dead.header("deadlettererrordescription").is_some());
    assert!(dead
        .lock_path()
        .starts_with("/orders/$deadletterqueue/messages/"));
    // Abandoning in the DLQ never dead-letters again [doc DLQ].
    assert_eq!(
        client
            .call(Method::PUT, &dead.lock_path(), &[], "")
            .await
            .status,
        StatusCode::OK
    );
    let dead = client.peek_lock("orders/$deadletterqueue", 5).await;
    assert_eq!(
        client
            .call(Method::DELETE, &dead.lock_path(), &[], "")
            .await
            .status,
        StatusCode::OK
    );
    assert_eq!(client.state("orders").await["deadLetterMessageCount"], 0);
}

/// [doc TTL]: an expired message is dropped, or dead-lettered with `TTLExpiredException` when
/// enabled; the default TTL caps a longer message TTL.
#[tokio::test]
async fn expired_messages_are_dropped_or_dead_lettered() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("drop", "").await;
    client
        .create_queue(
            "keep",
            // Long enough for the state below to be read first on a loaded machine.
            r#"{"deadLetteringOnMessageExpiration":true,"defaultMessageTimeToLive":"PT2S"}"#,
        )
        .await;
    client.send("drop", "short", r#"{"TimeToLive":0.3}"#).await;
    client
        .send("keep", "capped", r#"{"TimeToLive":3600}"#)
        .await;
    assert_eq!(
        client.state("keep").await["messages"][0]["timeToLiveSeconds"],
        2.0
    );

    // Waiting on the DLQ wakes when the message expires into it.
    let dead = client
        .call(
            Method::DELETE,
            "/keep/$DeadLetterQueue/messages/head?timeout=30",
            &[],
            "",
        )
        .await;
    assert_eq!(dead.status, StatusCode::OK);
    assert_eq!(dead.body, "capped");
    assert_eq!(
        dead.header("deadletterreason"),
        Some("\"TTLExpiredException\"")
    );

    tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    assert_eq!(
        client.peek_lock("drop", 0).await.status,
        StatusCode::NO_CONTENT
    );
    let state = client.state("drop").await;
    assert_eq!(state["activeMessageCount"], 0);
    assert_eq!(state["deadLetterMessageCount"], 0);
}

/// [doc TTL]: a locked message does not expire while its lock holds; once released it expires at
/// once.
#[tokio::test]
async fn locked_messages_expire_only_when_released() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client
        .create_queue("q", r#"{"deadLetteringOnMessageExpiration":true}"#)
        .await;
    // Long enough for the receive below to lock it first on a loaded machine.
    client.send("q", "x", r#"{"TimeToLive":2}"#).await;
    let got = client.peek_lock("q", 5).await;
    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(client.state("q").await["lockedMessageCount"], 1);
    assert_eq!(
        client
            .call(Method::PUT, &got.lock_path(), &[], "")
            .await
            .status,
        StatusCode::OK
    );
    let state = client.state("q").await;
    assert_eq!(state["activeMessageCount"], 0);
    assert_eq!(
        state["deadLetterMessages"][0]["deadLetterReason"],
        "TTLExpiredException"
    );
}

/// [doc DUP]: a MessageId seen within the window is acknowledged with 201 and dropped; after the
/// window it is accepted again.
#[tokio::test]
async fn duplicate_detection_drops_repeats_within_the_window() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client
        .create_queue(
            "dedup",
            // Long enough for the repeat below to come within it on a loaded machine.
            r#"{"requiresDuplicateDetection":true,"duplicateDetectionHistoryTimeWindow":"PT2S"}"#,
        )
        .await;
    client.create_queue("plain", "").await;
    for queue in ["dedup", "plain"] {
        for _ in 0..2 {
            assert_eq!(
                client
                    .send(queue, "x", r#"{"MessageId":"same"}"#)
                    .await
                    .status,
                StatusCode::CREATED
            );
        }
    }
    assert_eq!(client.state("dedup").await["activeMessageCount"], 1);
    assert_eq!(client.state("plain").await["activeMessageCount"], 2);

    tokio::time::sleep(std::time::Duration::from_millis(2500)).await;
    assert_eq!(
        client
            .send("dedup", "x", r#"{"MessageId":"same"}"#)
            .await
            .status,
        StatusCode::CREATED
    );
    assert_eq!(client.state("dedup").await["activeMessageCount"], 2);
}

/// [doc BATCH]: a JSON array body with the batch content type answers 201 and enqueues each
/// message with its properties.
#[tokio::test]
async fn batch_send_enqueues_every_message() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("batch", "").await;
    let body = r#"[{"Body":"This is the first message","UserProperties":{"Color":"Red","Count":3}},
                   {"Body":"This is the second message","BrokerProperties":{"Label":"M2","TimeToLiveTimeSpan":"0.00:00:40"}},
                   {"Body":"This is the third message","BrokerProperties":{"Label":"M3"},"UserProperties":{"Flag":true}}]"#;
    let sent = client
        .call(
            Method::POST,
            "/batch/messages",
            &[("Content-Type", "application/vnd.microsoft.servicebus.yml")],
            body,
        )
        .await;
    assert_eq!(sent.status, StatusCode::CREATED, "{}", sent.body);

    let first = client
        .call(Method::DELETE, "/batch/messages/head", &[], "")
        .await;
    assert_eq!(first.body, "This is the first message");
    assert_eq!(first.header("color"), Some("\"Red\""));
    assert_eq!(first.header("count"), Some("3"));
    let second = client
        .call(Method::DELETE, "/batch/messages/head", &[], "")
        .await;
    assert_eq!(second.broker_properties()["Label"], "M2");
    assert_eq!(second.broker_properties()["TimeToLive"], 40.0);
    let third = client
        .call(Method::DELETE, "/batch/messages/head", &[], "")
        .await;
    assert_eq!(third.header("flag"), Some("true"));

    let bad = client
        .call(
            Method::POST,
            "/batch/messages",
            &[("Content-Type", "application/vnd.microsoft.servicebus.yml")],
            "[{\"Body\":1}]",
        )
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
    assert_eq!(client.state("batch").await["activeMessageCount"], 0);
}

/// [doc PROPS]: a malformed BrokerProperties is refused with 400 and nothing is enqueued.
#[tokio::test]
async fn malformed_broker_properties_are_400() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("q", "").await;
    for bad in [
        "{not json",
        "[1,2]",
        r#"{"TimeToLive":"soon"}"#,
        r#"{"MessageId":7}"#,
        r#"{"ScheduledEnqueueTimeUtc":"tomorrow"}"#,
    ] {
        let reply = client.send("q", "x", bad).await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(
            reply.body.starts_with("<Error><Code>400</Code>"),
            "{}",
            reply.body
        );
    }
    assert_eq!(client.state("q").await["activeMessageCount"], 0);
}

/// [doc SEND]: 403 when the message is too large; [doc SEND, PEEK, DEL]: 410 for a missing entity.
#[tokio::test]
async fn too_large_is_403_and_missing_entities_are_410() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client
        .create_queue("small", r#"{"maxMessageSizeInKilobytes":1}"#)
        .await;
    let big = "x".repeat(2048);
    assert_eq!(
        client.send("small", &big, "{}").await.status,
        StatusCode::FORBIDDEN
    );
    assert_eq!(
        client.send("small", "fits", "{}").await.status,
        StatusCode::CREATED
    );

    assert_eq!(
        client.send("nowhere", "x", "{}").await.status,
        StatusCode::GONE
    );
    assert_eq!(
        client.peek_lock("nowhere", 0).await.status,
        StatusCode::GONE
    );
    assert_eq!(
        client
            .call(Method::DELETE, "/nowhere/messages/head", &[], "")
            .await
            .status,
        StatusCode::GONE
    );
    let lock = "/nowhere/messages/1/7da9cfd5-40d5-4bb1-8d64-ec5a52e1c547";
    for method in [Method::DELETE, Method::PUT, Method::POST] {
        assert_eq!(
            client.call(method, lock, &[], "").await.status,
            StatusCode::GONE
        );
    }
    // Only the broker puts messages into a DLQ.
    assert_eq!(
        client
            .send("small/$DeadLetterQueue", "x", "{}")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );
    // Not a data-plane operation.
    assert_eq!(
        client
            .call(Method::GET, "/small/messages", &[], "")
            .await
            .status,
        StatusCode::METHOD_NOT_ALLOWED
    );
}

/// Multi-segment entity paths [doc ADDR], a subscription-shaped path [doc PEEK], scheduled
/// messages [doc PROPS, SUPPORT] and the crate's `+0000` date form.
#[tokio::test]
async fn multi_segment_paths_and_scheduled_messages() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("mytopic/subscriptions/sub1", "").await;
    client
        .send("mytopic/subscriptions/sub1", "via sub", "{}")
        .await;
    let got = client.peek_lock("mytopic/subscriptions/sub1", 5).await;
    assert_eq!(got.status, StatusCode::CREATED);
    assert!(got
        .lock_path()
        .starts_with("/mytopic/subscriptions/sub1/messages/1/"));
    assert_eq!(
        client
            .call(Method::DELETE, &got.lock_path(), &[], "")
            .await
            .status,
        StatusCode::OK
    );

    client.create_queue("later", "").await;
    let at = chrono::Utc::now() + chrono::Duration::seconds(2);
    let props = format!(
        r#"{{"ScheduledEnqueueTimeUtc":"{}"}}"#,
        at.format("%a, %d %b %Y %H:%M:%S +0000")
    );
    assert_eq!(
        client.send("later", "scheduled", &props).await.status,
        StatusCode::CREATED
    );
    let state = client.state("later").await;
    assert_eq!(state["scheduledMessageCount"], 1);
    assert_eq!(
        client.peek_lock("later", 0).await.status,
        StatusCode::NO_CONTENT
    );
    let got = client.peek_lock("later", 30).await;
    assert_eq!(got.status, StatusCode::CREATED);
    let scheduled = got.broker_properties()["ScheduledEnqueueTimeUtc"].clone();
    assert!(
        matches!(scheduled, Value::String(ref s) if s.ends_with("GMT")),
        "{scheduled}"
    );
}

/// Non-ASCII text in BrokerProperties is escaped so the header stays ASCII.
#[tokio::test]
async fn non_ascii_labels_are_escaped() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("q", "").await;
    // JSON-escaped on the way in (reqwest only sends ASCII header values); decoded by the emulator.
    client.send("q", "x", r#"{"Label":"caf\u00e9"}"#).await;
    let got = client.peek_lock("q", 5).await;
    let raw = got
        .header("brokerproperties")
        .expect("ASCII BrokerProperties");
    assert!(raw.contains("caf\\u00e9"), "{raw}");
    assert_eq!(got.broker_properties()["Label"], "café");
}
