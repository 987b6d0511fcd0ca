//! The control API (`/$emulator/...`) and injected faults.

mod common;

use common::Client;
use reqwest::{Method, StatusCode};
use txinbox_sb_emulator::{Emulator, FaultRule, QueueProperties};

#[tokio::test]
async fn queues_are_created_read_and_deleted() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    let created = client
        .create_queue(
            "orders",
            r#"{"lockDuration":"PT1.5S","maxDeliveryCount":3,"requiresDuplicateDetection":true,
                "duplicateDetectionHistoryTimeWindow":20000,"defaultMessageTimeToLive":"P1D",
                "deadLetteringOnMessageExpiration":true}"#,
        )
        .await
        .json();
    let props = &created["properties"];
    assert_eq!(props["lockDuration"], "PT1.5S");
    assert_eq!(props["lockDurationMs"], 1500);
    assert_eq!(props["maxDeliveryCount"], 3);
    assert_eq!(props["requiresDuplicateDetection"], true);
    assert_eq!(props["duplicateDetectionHistoryTimeWindow"], "PT20S");
    assert_eq!(props["defaultMessageTimeToLive"], "P1D");
    assert_eq!(props["deadLetteringOnMessageExpiration"], true);

    // PUT again replaces the properties and keeps the messages (200).
    client
        .send("orders", "kept", r#"{"MessageId":"m-1"}"#)
        .await;
    let replaced = client
        .admin(
            Method::PUT,
            "/$emulator/queues/orders",
            r#"{"lockDuration":"PT2S"}"#,
        )
        .await;
    assert_eq!(replaced.status, StatusCode::OK);
    let state = replaced.json();
    assert_eq!(state["properties"]["lockDuration"], "PT2S");
    assert_eq!(state["properties"]["maxDeliveryCount"], 10);
    assert_eq!(state["messages"][0]["messageId"], "m-1");
    assert_eq!(state["messages"][0]["body"], "kept");
    assert_eq!(state["messages"][0]["state"], "available");
    assert_eq!(state["messages"][0]["contentType"], "text/plain");

    let list = client.admin(Method::GET, "/$emulator/queues", "").await;
    assert_eq!(list.status, StatusCode::OK);
    assert_eq!(list.json()[0]["path"], "orders");

    for bad in [
        r#"{"lockDuration":"PT10M"}"#,
        r#"{"lockDuration":"soon"}"#,
        r#"{"maxDeliveryCount":0}"#,
        r#"{"unknown":1}"#,
        "{",
    ] {
        let reply = client
            .admin(Method::PUT, "/$emulator/queues/other", bad)
            .await;
        assert_eq!(reply.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(reply.json()["error"].is_string());
    }
    assert_eq!(
        client
            .admin(Method::PUT, "/$emulator/queues/a/messages", "")
            .await
            .status,
        StatusCode::BAD_REQUEST
    );

    // A receive waiting on a queue that is deleted answers 410.
    let waiting = tokio::spawn({
        let client = Client::new(&emulator);
        async move { client.peek_lock("gone-soon", 30).await }
    });
    client.create_queue("gone-soon", "").await;
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert_eq!(
        client
            .admin(Method::DELETE, "/$emulator/queues/gone-soon", "")
            .await
            .status,
        StatusCode::OK
    );
    let status = waiting.await.expect("receiver task").status;
    assert!(
        status == StatusCode::GONE || status == StatusCode::NO_CONTENT,
        "{status}"
    );
    assert_eq!(
        client
            .admin(Method::DELETE, "/$emulator/queues/gone-soon", "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/queues/gone-soon", "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client.send("gone-soon", "x", "{}").await.status,
        StatusCode::GONE
    );
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/health", "")
            .await
            .json()["status"],
        "ok"
    );
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/nothing", "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn status_faults_answer_without_performing_the_operation() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("orders", "").await;
    let added = client
        .admin(
            Method::POST,
            "/$emulator/faults",
            r#"[{"kind":"status","status":429,"retry_after_seconds":2,"method":"POST","path_suffix":"/orders/messages","count":2},
                {"status":503,"method":"POST","path_suffix":"/messages/head"},
                {"status":500,"method":"DELETE"}]"#,
        )
        .await;
    assert_eq!(added.status, StatusCode::CREATED, "{}", added.body);
    assert_eq!(added.json().as_array().map(Vec::len), Some(3));

    for _ in 0..2 {
        let reply = client.send("orders", "x", "{}").await;
        assert_eq!(reply.status, StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(reply.header("retry-after"), Some("2"));
        assert!(reply.body.contains("50009"), "{}", reply.body);
    }
    assert_eq!(client.state("orders").await["activeMessageCount"], 0);
    assert_eq!(
        client.send("orders", "x", "{}").await.status,
        StatusCode::CREATED
    );

    let busy = client.peek_lock("orders", 0).await;
    assert_eq!(busy.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(client.state("orders").await["lockedMessageCount"], 0);
    let broken = client
        .call(Method::DELETE, "/orders/messages/head", &[], "")
        .await;
    assert_eq!(broken.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(client.state("orders").await["activeMessageCount"], 1);
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/faults", "")
            .await
            .json(),
        serde_json::json!([])
    );
    assert_eq!(
        client
            .call(Method::DELETE, "/orders/messages/head", &[], "")
            .await
            .status,
        StatusCode::OK
    );

    let bad = client
        .admin(Method::POST, "/$emulator/faults", r#"{"status":200}"#)
        .await;
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn dropped_responses_still_perform_the_operation() {
    let emulator = common::start().await;
    let client = Client::new(&emulator);
    client.create_queue("orders", "").await;
    client
        .admin(
            Method::POST,
            "/$emulator/faults",
            r#"{"kind":"drop_response","method":"POST","path_suffix":"/orders/messages"}"#,
        )
        .await;
    let token = common::sas_token(
        &common::public_url("/orders/messages"),
        common::KEY_NAME,
        common::KEY,
        common::now_unix() + 60,
    );
    let lost = client
        .try_call(
            Method::POST,
            "/orders/messages",
            Some(&token),
            &[("BrokerProperties", r#"{"MessageId":"m-1"}"#)],
            "x",
        )
        .await;
    assert!(lost.is_err(), "the connection closes without an answer");
    assert_eq!(
        client.state("orders").await["activeMessageCount"],
        1,
        "the send took effect"
    );

    // A dropped peek-lock leaves the message locked, as a lost response would.
    emulator
        .inject_fault(
            FaultRule::drop_response()
                .method("POST")
                .path_suffix("/messages/head"),
        )
        .expect("valid rule");
    let token = common::sas_token(
        &common::public_url("/orders/messages/head"),
        common::KEY_NAME,
        common::KEY,
        common::now_unix() + 60,
    );
    assert!(client
        .try_call(Method::POST, "/orders/messages/head", Some(&token), &[], "")
        .await
        .is_err());
    let state = client.state("orders").await;
    assert_eq!(state["lockedMessageCount"], 1);
    assert_eq!(state["messages"][0]["deliveryCount"], 1);
}

#[tokio::test]
async fn delay_faults_and_reset() {
    let emulator =
        common::start_with(Emulator::builder().queue("configured", QueueProperties::default()))
            .await;
    let client = Client::new(&emulator);
    client.create_queue("extra", "").await;
    client
        .admin(
            Method::POST,
            "/$emulator/faults",
            r#"{"kind":"delay","delay_ms":100,"path_suffix":"/configured/messages"}"#,
        )
        .await;
    assert_eq!(
        client.send("configured", "x", "{}").await.status,
        StatusCode::CREATED
    );
    assert_eq!(client.state("configured").await["activeMessageCount"], 1);
    client
        .admin(Method::POST, "/$emulator/faults", r#"{"status":503}"#)
        .await;

    let reset = client.admin(Method::POST, "/$emulator/reset", "").await;
    assert_eq!(reset.status, StatusCode::OK);
    assert_eq!(client.state("configured").await["activeMessageCount"], 0);
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/queues/extra", "")
            .await
            .status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        client
            .admin(Method::GET, "/$emulator/faults", "")
            .await
            .json(),
        serde_json::json!([])
    );
    assert_eq!(
        client.send("configured", "x", "{}").await.status,
        StatusCode::CREATED
    );

    // The Rust API mirrors the control API.
    emulator
        .inject_fault(FaultRule::status(429).count(1))
        .expect("valid rule");
    assert_eq!(
        client.send("configured", "x", "{}").await.status,
        StatusCode::TOO_MANY_REQUESTS
    );
    emulator
        .inject_fault(FaultRule::status(503))
        .expect("valid rule");
    emulator.clear_faults();
    assert_eq!(
        client.send("configured", "x", "{}").await.status,
        StatusCode::CREATED
    );
    assert!(emulator.delete_queue("configured"));
    assert!(emulator.queue_state("configured").is_none());
    assert!(emulator
        .create_queue("bad//path", QueueProperties::default())
        .is_err());
}
