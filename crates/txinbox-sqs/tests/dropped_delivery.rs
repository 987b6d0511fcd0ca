//! A FIFO delivery dropped unsettled (its processing panicked, or was abandoned) leaves its message in flight at
//! SQS until its visibility timeout, and its group behind it. AWS (SQS Developer Guide, "Interleaving multiple
//! ordered message groups"): "When a message with a specific MessageGroupId is being processed and is
//! invisible, no other consumer can process messages from that same group until the visibility timeout expires
//! or the message is deleted."

mod common;

use std::time::Duration;

use common::*;
use txinbox_core::{Delivery, Receiver};

/// Two messages of one group come in one answer: the first is handed out, the second held behind it. The first
/// is dropped unsettled: the receiver freed the group and handed out the second while SQS still held the
/// first, which came back after it. The second waits until the first's visibility has run out, goes back to
/// SQS behind it, and the first comes back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delivery_dropped_unsettled_keeps_its_group_busy() {
    let c = client().await;
    let q = queue_pair(&c, 5, 3).await;
    send(&c, &q.url, "{}", Some("evt-0"), "d-0", "g-1").await;
    send(&c, &q.url, "{}", Some("evt-1"), "d-1", "g-1").await;
    let mut r = fast_receiver(c.clone(), &q, 3).await;

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut first = Vec::new();
    while first.is_empty() && tokio::time::Instant::now() < deadline {
        first = r.receive(10).await.expect("receive");
    }
    let ids: Vec<String> = first.iter().map(ce_id).collect();
    assert_eq!(ids, ["evt-0"], "the first of the group, the second held");
    // Processing panicked: the delivery is dropped, neither acknowledged nor released.
    drop(first);

    let mut order: Vec<String> = Vec::new();
    while order.len() < 2 && tokio::time::Instant::now() < deadline {
        for d in r.receive(10).await.expect("receive") {
            let id = ce_id(&d);
            d.ack().await.expect("ack");
            if !order.contains(&id) {
                order.push(id);
            }
        }
    }
    assert_eq!(order, ["evt-0", "evt-1"], "the group's order");
    assert_eq!(total(&c, &q.url).await, 0, "both deleted");
}
