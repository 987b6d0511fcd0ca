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

/// A message the check locked, whose lock lapsed before the first receive (the worker started late), is not
/// handed out: Microsoft, Peek-Lock Message: "When the lock expires, the message becomes available to other
/// receivers", so that delivery's complete would find no lock, and the message itself comes back with a new
/// lock, a second delivery of it in the same batch. The receive hands out one delivery, whose lock holds: its
/// complete succeeds and the queue is empty.
#[tokio::test]
async fn a_message_whose_check_lock_lapsed_is_not_handed_out() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(serde_json::json!({"lockDuration": "PT1S"})).await;
    publish(&client, &event(&q, "evt-late", "{}")).await;
    let mut r = ServiceBusReceiver::new(&client, &q, fast_options(Duration::from_secs(1))).unwrap();
    r.check().await.expect("usable");
    // The check's lock lapses before the worker's first receive.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let got = r.receive(8).await.unwrap();
    let ids: Vec<_> = got
        .iter()
        .map(|d| d.message().producer_id.clone())
        .collect();
    assert_eq!(
        ids,
        [Some("evt-late".to_owned())],
        "one delivery of the message"
    );
    for d in got {
        d.ack()
            .await
            .expect("the delivery handed out holds its lock");
    }
    assert_eq!(emu.counts(&q).await, (0, 0));
}

/// A message the check locked is handed out with its lock renewed (Microsoft, Renew-Lock for a Message: "Renews
/// the lock on an already locked message."; `RenewMessageLockAsync`: "The lock will be renewed based on the
/// setting specified on the queue."): the worker's lease keeper counts a whole lock
/// from the receive, and the part the check's lock spent waiting would otherwise end the lock before the
/// keeper's first renewal. No delivery is spent: the delivery count stays 1.
#[tokio::test]
async fn a_message_locked_by_the_check_is_handed_out_with_a_renewed_lock() {
    let emu = Emu::shared().await;
    let client = emu.client();
    let q = emu.queue(serde_json::json!({"lockDuration": "PT3S"})).await;
    publish(&client, &event(&q, "evt-renewed", "{}")).await;
    let mut r = ServiceBusReceiver::new(&client, &q, fast_options(Duration::from_secs(3))).unwrap();
    r.check().await.expect("usable");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let got = r.receive(8).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].message().delivery_count, 1, "no delivery spent");
    // Past the check's lock (3 s from the check, 2 s ago): held only if the hand-out renewed it.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for d in got {
        d.ack().await.expect("the lock was renewed when handed out");
    }
    assert_eq!(emu.counts(&q).await, (0, 0));
}
