//! The start-up check ([`Receiver::check`]) against the emulator: a wrong key (401) and a missing queue (410)
//! are refused with one line that names the queue and never the key; a usable queue passes, and a message
//! the check locked is the first one the worker gets (no delivery count spent).

use std::time::Duration;

use txinbox_core::{BrokerErrorKind, Delivery, Receiver};
use txinbox_servicebus::{ServiceBusConfig, ServiceBusReceiver};

use crate::common::*;

#[tokio::test]
async fn a_wrong_key_is_refused_without_echoing_it() {
    let emu = Emu::shared().await;
    let q = emu.queue(serde_json::json!({})).await;
    let wrong = "d3Jvbmcta2V5LWZvci10aGUtdGVzdA==";
    let client = ServiceBusConfig::shared_access_key(&emu.namespace, &emu.key_name, wrong)
        .endpoint(emu.url.parse().unwrap())
        .connect()
        .unwrap();
    let mut r =
        ServiceBusReceiver::new(&client, &q, fast_options(Duration::from_secs(30))).unwrap();
    let e = r.check().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::Unauthorized, "{e}");
    let line = e.to_string();
    assert!(
        !line.contains('\n') && line.contains(&q) && line.contains("401"),
        "{line}"
    );
    assert!(
        !line.contains(wrong) && !line.contains(&emu.key),
        "no key in {line}"
    );
}

#[tokio::test]
async fn a_missing_queue_is_refused() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let missing = format!("missing-{}", uuid::Uuid::new_v4().simple());
    let mut r =
        ServiceBusReceiver::new(&client, &missing, fast_options(Duration::from_secs(30))).unwrap();
    let e = r.check().await.unwrap_err();
    assert_eq!(e.kind(), BrokerErrorKind::EntityNotFound, "{e}");
    assert!(e.to_string().contains(&missing), "{e}");
}

#[tokio::test]
async fn a_message_locked_by_the_check_is_the_first_one_received() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu
        .queue(serde_json::json!({"lockDuration": "PT30S"}))
        .await;
    publish(&client, &event(&q, "evt-check", "{}")).await;
    let mut r =
        ServiceBusReceiver::new(&client, &q, fast_options(Duration::from_secs(30))).unwrap();
    r.check().await.expect("usable");
    let got = r.receive(8).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(
        got[0].message().delivery_count,
        1,
        "no delivery spent by the check"
    );
    for d in got {
        d.ack().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await, (0, 0));
}
