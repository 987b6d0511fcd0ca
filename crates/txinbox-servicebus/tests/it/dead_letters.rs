//! Reading dead letters ([`read_dead_letters`]) against the emulator.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use txinbox_servicebus::{
    dead_letter_queue_path, dlq::ENQUEUED_AT_PROPERTY, read_dead_letters, redrive, RedriveOptions,
    ServiceBusClient,
};

use crate::common::*;

/// Asserts that `read` holds each of `ids` (the messages' ids) once, and nothing else.
fn read_once_each(read: &[txinbox_servicebus::DeadLetteredMessage], ids: &[impl AsRef<str>]) {
    let got: Vec<_> = read
        .iter()
        .map(|d| d.message.producer_id.clone().unwrap_or_default())
        .collect();
    let unique: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got.len(), unique.len(), "a dead letter read twice: {got:?}");
    assert_eq!(
        unique,
        ids.iter()
            .map(|s| s.as_ref().to_owned())
            .collect::<BTreeSet<_>>(),
        "read: {got:?}"
    );
}

/// REST has no browse: the reader peek-locks each dead letter and releases them all at the end. When the
/// dead-letter queue's lock is shorter than the read (here 1 s, and a 3 s long poll after the last message),
/// the first locks lapse before the read ends, and Microsoft, Peek-Lock Message: "When the lock expires, the
/// message becomes available to other receivers": the reader itself locks them again. Each dead letter is
/// returned once, whatever `max` allows.
#[tokio::test]
async fn a_read_longer_than_the_lock_returns_each_dead_letter_once() {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT1S", "maxDeliveryCount": 1})).await;
    let ids = ["evt-d0", "evt-d1", "evt-d2"];
    for id in ids {
        publish(&client, &event(&q, id, "{}")).await;
    }
    // One delivery each, abandoned: past MaxDeliveryCount 1, the broker dead-letters them.
    let mut receiver = fast_receiver(&client, &q, Duration::from_secs(1));
    for _ in ids {
        receive_next(&mut receiver).await.abandon().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await, (0, 3));

    let read = read_dead_letters(
        &client,
        &dead_letter_queue_path(&q),
        100,
        Duration::from_secs(3),
    )
    .await
    .unwrap();
    read_once_each(&read, &ids);
    assert_eq!(emu.counts(&q).await, (0, 3), "reading does not remove");
}

/// A redrive that lasts longer than the source's lock (here 1 s, each send to the target held back 600 ms by
/// the emulator): Microsoft, Peek-Lock Message: "When the lock expires, the message becomes available to other
/// receivers". The dead letter the redrive left in place first (inside the duplicate-detection window, so
/// deferred and its lock held) comes round again, twice, before the messages behind it have been looked at;
/// and the first one moved, whose send outlasts its lock (1.5 s), is sent but cannot be completed, and comes
/// round again too. The redrive moves every dead letter behind them, sends none of them twice, and leaves in
/// the source the deferred one and the one it sent but could not complete.
#[tokio::test]
async fn a_redrive_longer_than_the_lock_moves_every_dead_letter_once() {
    let (emu, client, from) = emu_queue(json!({"lockDuration": "PT1S"})).await;
    let to = emu.queue(json!({})).await;
    // The deferred one first: enqueued (as the forwarded copy says) just now, inside the window.
    let young = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let mut deferred = event(&from, "evt-young", "{}");
    deferred
        .attributes
        .insert(ENQUEUED_AT_PROPERTY.to_owned(), young);
    publish(&client, &deferred).await;
    let old: Vec<String> = (0..6).map(|i| format!("evt-old-{i}")).collect();
    for id in &old {
        let mut m = event(&from, id, "{}");
        m.attributes.insert(
            ENQUEUED_AT_PROPERTY.to_owned(),
            "2020-01-02T03:04:05Z".into(),
        );
        publish(&client, &m).await;
    }
    let sends = format!("/{to}/messages");
    emu.fault(json!({"kind": "delay", "delay_ms": 1500, "method": "POST", "path_suffix": sends, "count": 1}))
        .await;
    emu.fault(json!({"kind": "delay", "delay_ms": 600, "method": "POST", "path_suffix": sends, "count": 5}))
        .await;

    let options = RedriveOptions::default()
        .wait(Duration::from_secs(1))
        .duplicate_detection_window(Duration::from_secs(3600));
    let report = redrive(&client, &from, &to, &options, &mut ())
        .await
        .expect("redrive");

    let target = emu.state(&to).await;
    let sent: Vec<String> = target["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageId"].as_str().unwrap_or_default().to_owned())
        .collect();
    let unique: BTreeSet<_> = sent.iter().cloned().collect();
    assert_eq!(
        sent.len(),
        unique.len(),
        "a dead letter sent twice: {sent:?}"
    );
    assert_eq!(
        unique,
        old.iter().cloned().collect::<BTreeSet<_>>(),
        "every old dead letter sent (report {report:?})"
    );
    assert_eq!(report.deferred, 1, "{report:?}");
    assert_eq!(report.moved + report.settle_failed, 6, "{report:?}");
    assert_eq!(report.settle_failed, 1, "{report:?}");
    let left = emu.state(&from).await;
    let mut left_ids: Vec<String> = left["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["messageId"].as_str().unwrap_or_default().to_owned())
        .collect();
    left_ids.sort();
    assert_eq!(left_ids, ["evt-old-0", "evt-young"], "{left}");
}

/// Six messages (`{prefix}0` to `{prefix}5`) dead-lettered by the broker from a queue with a 1 s lock: the
/// emulator, the client, the queue, the ids and the dead-letter queue's path.
async fn six_dead_letters(prefix: &str) -> (Emu, ServiceBusClient, String, Vec<String>, String) {
    let (emu, client, q) = emu_queue(json!({"lockDuration": "PT1S", "maxDeliveryCount": 1})).await;
    let ids: Vec<String> = (0..6).map(|i| format!("{prefix}{i}")).collect();
    for id in &ids {
        publish(&client, &event(&q, id, "{}")).await;
    }
    let mut receiver = fast_receiver(&client, &q, Duration::from_secs(1));
    for _ in &ids {
        receive_next(&mut receiver).await.abandon().await.unwrap();
    }
    assert_eq!(emu.counts(&q).await, (0, 6));
    let dlq = dead_letter_queue_path(&q);
    (emu, client, q, ids, dlq)
}

/// Reads `dlq` and asserts each of `ids` came back once, and that the read left them all in place.
async fn read_every_one_once(
    emu: &Emu,
    client: &ServiceBusClient,
    q: &str,
    dlq: &str,
    ids: &[String],
) {
    let read = read_dead_letters(client, dlq, 100, Duration::from_secs(1))
        .await
        .unwrap();
    read_once_each(&read, ids);
    assert_eq!(emu.counts(q).await, (0, 6), "reading does not remove");
}

/// A read whose receives take unevenly long against the lock (1 s; receives alternately 450 ms and 600 ms):
/// a lock with just over half its length left is not due for renewal by the half-length rule, and the slower
/// receive that follows outlasts it, so the first message comes round again, and again a lock later (Microsoft,
/// Peek-Lock Message: "When the lock expires, the message becomes available to other receivers"). Neither is the
/// end of the read: the held locks are renewed ahead of the slowest receive seen, and the read goes on until
/// more messages in a row came round again than it has looked at. Every dead letter is read, once.
#[tokio::test]
async fn a_read_whose_receives_vary_against_the_lock_reaches_every_dead_letter() {
    let (emu, client, q, ids, dlq) = six_dead_letters("evt-v").await;
    let head = format!("{dlq}/messages/head");
    // Applied in order, one receive each: 450 ms for the first two, then 600 and 450 by turns.
    let delays: Vec<_> = (0..30)
        .map(|i| {
            let delay_ms = if i >= 2 && i % 2 == 0 { 600 } else { 450 };
            json!({"kind": "delay", "delay_ms": delay_ms, "method": "POST", "path_suffix": head, "count": 1})
        })
        .collect();
    emu.fault(json!(delays)).await;

    read_every_one_once(&emu, &client, &q, &dlq, &ids).await;
}

/// A read whose receives take long against the lock (here each 400 ms, a 1 s lock): the messages it holds
/// lapse as fast as it reads (Microsoft, Peek-Lock Message: "When the lock expires, the message becomes
/// available to other receivers") and, coming first in sequence-number order, would be all its receives hand
/// back, the messages behind them never reached. Renewing what it holds (Renew-Lock for a Message: "Renews the
/// lock on an already locked message.") keeps them hidden: every dead letter is read, once.
#[tokio::test]
async fn a_read_whose_receives_outlast_the_lock_reaches_every_dead_letter() {
    let (emu, client, q, ids, dlq) = six_dead_letters("evt-s").await;
    emu.fault(json!({"kind": "delay", "delay_ms": 400, "method": "POST",
        "path_suffix": format!("{dlq}/messages/head"), "count": 40}))
        .await;

    read_every_one_once(&emu, &client, &q, &dlq, &ids).await;
}
