//! SAS [doc SAS] and bearer [doc AUTHN] checking over plain HTTP: 401 for a missing, expired,
//! wrongly signed, unknown-key or wrong-resource token.

mod common;

use common::{now_unix, public_url, sas_token, Client, KEY, KEY_NAME, NAMESPACE};
use reqwest::{Method, StatusCode};
use txinbox_sb_emulator::{Emulator, QueueProperties};

async fn send_with(client: &Client, authorization: Option<&str>) -> StatusCode {
    client
        .call_with_auth(Method::POST, "/orders/messages", authorization, &[], "x")
        .await
        .status
}

#[tokio::test]
async fn valid_sas_tokens_are_accepted_in_every_documented_form() {
    let emulator =
        common::start_with(Emulator::builder().queue("orders", QueueProperties::default())).await;
    let client = Client::new(&emulator);
    let expiry = now_unix() + 600;
    let loopback = format!("http://{}/orders", emulator.addr());
    for resource in [
        // The full request URL, as azure_messaging_servicebus signs it.
        public_url("/orders/messages"),
        // The entity, covering everything beneath it [doc SAS].
        public_url("/orders"),
        // The namespace, as in the REST doc examples (`sr=your-namespace`) [doc SEND].
        NAMESPACE.to_string(),
        format!("sb://{NAMESPACE}.servicebus.windows.net/"),
        // The host the request actually came to.
        loopback,
    ] {
        let token = sas_token(&resource, KEY_NAME, KEY, expiry);
        assert_eq!(
            send_with(&client, Some(&token)).await,
            StatusCode::CREATED,
            "{resource}"
        );
    }
    // Fields in another order, lower-case percent-encoding as .NET's HttpUtility.UrlEncode writes.
    let token = sas_token(&public_url("/orders"), KEY_NAME, KEY, expiry);
    let fields = token.trim_start_matches("SharedAccessSignature ");
    let mut parts: Vec<&str> = fields.split('&').collect();
    parts.reverse();
    let reordered = format!("SharedAccessSignature {}", parts.join("&"));
    assert_eq!(
        send_with(&client, Some(&reordered)).await,
        StatusCode::CREATED
    );
    assert_eq!(
        emulator
            .queue_state("orders")
            .expect("queue")
            .active_message_count,
        6
    );
}

#[tokio::test]
async fn bad_sas_tokens_are_401() {
    let emulator =
        common::start_with(Emulator::builder().queue("orders", QueueProperties::default())).await;
    let client = Client::new(&emulator);
    let resource = public_url("/orders/messages");
    let cases = [
        (
            "expired",
            Some(sas_token(&resource, KEY_NAME, KEY, now_unix() - 10)),
        ),
        (
            "wrong key",
            Some(sas_token(
                &resource,
                KEY_NAME,
                "not-the-key",
                now_unix() + 600,
            )),
        ),
        (
            "unknown key name",
            Some(sas_token(&resource, "SomeOtherRule", KEY, now_unix() + 600)),
        ),
        (
            "other entity",
            Some(sas_token(
                &public_url("/payments"),
                KEY_NAME,
                KEY,
                now_unix() + 600,
            )),
        ),
        (
            "other namespace",
            Some(sas_token(
                "https://other.servicebus.windows.net/orders",
                KEY_NAME,
                KEY,
                now_unix() + 600,
            )),
        ),
        ("no header", None),
        (
            "garbage",
            Some("SharedAccessSignature nonsense".to_string()),
        ),
        ("unknown scheme", Some("Basic dXNlcjpwYXNz".to_string())),
        ("unconfigured bearer", Some("Bearer some-token".to_string())),
    ];
    for (case, authorization) in cases {
        let reply = client
            .call_with_auth(
                Method::POST,
                "/orders/messages",
                authorization.as_deref(),
                &[],
                "x",
            )
            .await;
        assert_eq!(reply.status, StatusCode::UNAUTHORIZED, "{case}");
        assert!(
            reply.body.starts_with("<Error><Code>401</Code>"),
            "{case}: {}",
            reply.body
        );
    }
    // A token whose se was changed after signing fails the signature check.
    let token = sas_token(&resource, KEY_NAME, KEY, now_unix() + 600);
    let tampered = token.replace("&se=", "&se=1");
    assert_eq!(
        send_with(&client, Some(&tampered)).await,
        StatusCode::UNAUTHORIZED
    );
    // 401 comes before 410: an unknown entity with a bad token is still 401.
    let reply = client
        .call_with_auth(Method::POST, "/nowhere/messages/head", None, &[], "")
        .await;
    assert_eq!(reply.status, StatusCode::UNAUTHORIZED);
    assert_eq!(
        emulator
            .queue_state("orders")
            .expect("queue")
            .active_message_count,
        0
    );
}

#[tokio::test]
async fn configured_bearer_tokens_are_accepted() {
    let emulator = common::start_with(
        Emulator::builder()
            .accept_bearer("test-bearer-token")
            .queue("orders", QueueProperties::default()),
    )
    .await;
    let client = Client::new(&emulator);
    assert_eq!(
        send_with(&client, Some("Bearer test-bearer-token")).await,
        StatusCode::CREATED
    );
    assert_eq!(
        send_with(&client, Some("Bearer another-token")).await,
        StatusCode::UNAUTHORIZED
    );
    // SAS still works next to it.
    assert_eq!(
        client.send("orders", "x", "{}").await.status,
        StatusCode::CREATED
    );
}

#[tokio::test]
async fn without_credentials_every_request_is_accepted() {
    let emulator = Emulator::builder()
        .queue("orders", QueueProperties::default())
        .start("127.0.0.1:0")
        .await
        .expect("starts");
    let client = Client::new(&emulator);
    assert_eq!(send_with(&client, None).await, StatusCode::CREATED);
}
