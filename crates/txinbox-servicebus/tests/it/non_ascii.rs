//! Non-ASCII characters in `BrokerProperties` and custom properties, against the emulator.

use std::time::Duration;

use reqwest::header::HeaderValue;
use serde_json::json;
use txinbox_core::{DeadLetter, Delivery};
use txinbox_servicebus::ServiceBusReceiver;

use crate::common::*;

/// A producer that writes its properties as raw UTF-8 (a custom property `site: "Zürich 日本"`, a Label and a
/// CorrelationId with accents in `BrokerProperties`): Microsoft's Send Message takes "JSON-encoded set of
/// BrokeredMessage properties" and custom properties as headers, and the service hands them back as headers.
/// RFC 7230, 3.2.4: "A recipient SHOULD treat other octets in field content (obs-text) as opaque data." The
/// received message has every one of them, and the dead-letter copy forwarded from it keeps them.
#[tokio::test]
async fn non_ascii_properties_are_received_and_forwarded_intact() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT30S"})).await;
    let poison = emu.queue(json!({})).await;
    let broker_properties =
        r#"{"MessageId":"evt-zürich","Label":"réunion 日本","CorrelationId":"corr-é"}"#;
    let sent = reqwest::Client::new()
        .post(format!("{}/{q}/messages", emu.url))
        .bearer_auth(&emu.bearer)
        .header("Content-Type", "application/json")
        .header(
            "BrokerProperties",
            HeaderValue::from_bytes(broker_properties.as_bytes()).unwrap(),
        )
        .header(
            "site",
            HeaderValue::from_bytes("\"Zürich 日本\"".as_bytes()).unwrap(),
        )
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(sent.status().is_success(), "{}", sent.status());

    let options = fast_options(Duration::from_secs(30)).dead_letter_to(&poison);
    let mut receiver = ServiceBusReceiver::new(&client, &q, options).unwrap();
    let d = receive_next(&mut receiver).await;
    assert_eq!(d.message().producer_id.as_deref(), Some("evt-zürich"));
    assert_eq!(d.broker_properties().label.as_deref(), Some("réunion 日本"));
    assert_eq!(
        d.broker_properties().correlation_id.as_deref(),
        Some("corr-é")
    );
    assert_eq!(
        d.message().attribute("site"),
        Some("Zürich 日本"),
        "attributes: {:?}",
        d.message().attributes
    );

    d.dead_letter(DeadLetter::new("handler_permanent", "poison"))
        .await
        .expect("forwarded");
    assert_eq!(emu.counts(&q).await, (0, 0));
    let mut from_poison = fast_receiver(&client, &poison, Duration::from_secs(30));
    let copy = receive_next(&mut from_poison).await;
    assert_eq!(copy.message().producer_id.as_deref(), Some("evt-zürich"));
    assert_eq!(
        copy.broker_properties().label.as_deref(),
        Some("réunion 日本")
    );
    assert_eq!(
        copy.broker_properties().correlation_id.as_deref(),
        Some("corr-é")
    );
    assert_eq!(copy.message().attribute("site"), Some("Zürich 日本"));
    copy.ack().await.unwrap();
}

/// A custom property the adapter sends itself keeps its characters. Microsoft documents custom properties as
/// plain headers (REST Introduction: "If a single message is sent or received, each custom property is placed
/// in its own HTTP header."; Send Message: "In addition to the listed properties, the header can contain custom
/// properties.") and no escape for their values: a value written `caf\u{e9}` is stored as those characters.
/// Sent as raw UTF-8, as other producers send them and as the receive reads them back, a property
/// `site: "café 日本"` comes back as sent, to this adapter and in the stored message (what any other consumer
/// reads), and so does the dead-letter detail of the copy forwarded from it.
#[tokio::test]
async fn non_ascii_properties_sent_by_the_adapter_come_back_as_sent() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT30S"})).await;
    let poison = emu.queue(json!({})).await;
    let mut msg = event(&q, "evt-café", "{}");
    msg.attributes
        .insert("site".to_owned(), "café 日本".to_owned());
    publish(&client, &msg).await;
    let stored = emu.state(&q).await;
    assert_eq!(
        stored["messages"][0]["properties"]["site"], "café 日本",
        "{stored}"
    );

    let options = fast_options(Duration::from_secs(30)).dead_letter_to(&poison);
    let mut receiver = ServiceBusReceiver::new(&client, &q, options).unwrap();
    let d = receive_next(&mut receiver).await;
    assert_eq!(d.message().attribute("site"), Some("café 日本"));
    assert_eq!(d.message().attribute("ce-id"), Some("evt-café"));
    d.dead_letter(DeadLetter::new("handler_permanent", "refusé: 日本"))
        .await
        .expect("forwarded");

    let mut from_poison = fast_receiver(&client, &poison, Duration::from_secs(30));
    let copy = receive_next(&mut from_poison).await;
    assert_eq!(copy.message().attribute("site"), Some("café 日本"));
    assert_eq!(
        copy.message().attribute(txinbox_core::dead_letter::DETAIL),
        Some("refusé: 日本")
    );
    copy.ack().await.unwrap();
}
