//! Reading dead letters ([`read_dead_letters`]) against the emulator.

use std::collections::BTreeSet;
use std::time::Duration;

use serde_json::json;
use txinbox_servicebus::{dead_letter_queue_path, read_dead_letters};

use crate::common::*;

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
    let got: Vec<_> = read
        .iter()
        .map(|d| d.message.producer_id.clone().unwrap_or_default())
        .collect();
    let unique: BTreeSet<_> = got.iter().cloned().collect();
    assert_eq!(got.len(), unique.len(), "a dead letter read twice: {got:?}");
    assert_eq!(
        unique,
        ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>()
    );
    assert_eq!(emu.counts(&q).await, (0, 3), "reading does not remove");
}
