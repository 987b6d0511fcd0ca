//! The binary: flags, the `listening on http://ADDR` readiness line, and a signed request.

mod common;

use std::process::Command;

use reqwest::{Method, StatusCode};
use txinbox_testkit::child::Running;

#[tokio::test]
async fn the_binary_prints_its_address_and_serves() {
    let mut running = Running::spawn(
        Command::new(env!("CARGO_BIN_EXE_txinbox-sb-emulator"))
            .args([
                "--listen",
                "127.0.0.1:0",
                "--namespace",
                common::NAMESPACE,
                "--sas-key-name",
                common::KEY_NAME,
                "--sas-key",
                common::KEY,
                "--accept-bearer",
                "cli-token",
                "--queue",
                "orders",
                "--queue",
                r#"fast={"lockDuration":"PT1.5S","maxDeliveryCount":3}"#,
                "--location",
                "request",
            ])
            .env("RUST_LOG", "warn"),
    );
    let base = running.first_line_after("listening on ").await;
    assert!(base.starts_with("http://127.0.0.1:"), "{base}");

    let http = reqwest::Client::new();
    let health = http
        .get(format!("{base}/$emulator/health"))
        .send()
        .await
        .expect("health");
    assert_eq!(health.status(), StatusCode::OK);
    let fast = http
        .get(format!("{base}/$emulator/queues/fast"))
        .send()
        .await
        .expect("state");
    let fast: serde_json::Value =
        serde_json::from_str(&fast.text().await.expect("body")).expect("JSON");
    assert_eq!(fast["properties"]["lockDuration"], "PT1.5S");
    assert_eq!(fast["properties"]["maxDeliveryCount"], 3);

    let unsigned = http
        .post(format!("{base}/orders/messages"))
        .body("x")
        .send()
        .await
        .expect("send");
    assert_eq!(unsigned.status(), StatusCode::UNAUTHORIZED);
    let bearer = http
        .post(format!("{base}/orders/messages"))
        .header("Authorization", "Bearer cli-token")
        .body("x")
        .send()
        .await
        .expect("send");
    assert_eq!(bearer.status(), StatusCode::CREATED);
    let token = common::sas_token(
        &common::public_url("/orders/messages/head"),
        common::KEY_NAME,
        common::KEY,
        common::now_unix() + 60,
    );
    let got = http
        .request(
            Method::POST,
            format!("{base}/orders/messages/head?timeout=5"),
        )
        .header("Authorization", token)
        .send()
        .await
        .expect("peek-lock");
    assert_eq!(got.status(), StatusCode::CREATED);
    // `--location request` names the host the request came to.
    let location = got.headers()["location"]
        .to_str()
        .expect("ASCII")
        .to_string();
    assert!(
        location.starts_with(&format!("{base}/orders/messages/1/")),
        "{location}"
    );
    drop(running);
}
