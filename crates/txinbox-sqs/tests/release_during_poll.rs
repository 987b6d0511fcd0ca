//! A FIFO delivery released while the receiver's next long poll is already waiting: the poll can bring the
//! released message back (a retry's backoff shorter than the poll's wait). It is first of its group then, and
//! is handed out by that receive. AWS (SQS Developer Guide, "Interleaving multiple ordered message groups"):
//! "When a message with a specific MessageGroupId is being processed and is invisible, no other consumer can
//! process messages from that same group until the visibility timeout expires or the message is deleted." A
//! released message is neither: it is the group's first again. Held behind its own earlier delivery, it went
//! back to SQS at the next receive and came back once more, a receive counted toward the queue's
//! `maxReceiveCount` with no attempt made ("If the ReceiveCount for a message exceeds the maximum receive count
//! for the queue, Amazon SQS moves the message to the dead-letter queue", SQS Developer Guide, "Using
//! dead-letter queues").

mod common;

use std::time::Duration;

use common::*;
use txinbox_core::{Delivery, Receiver};
use txinbox_sqs::SqsReceiver;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_released_during_the_next_long_poll_is_handed_out_by_it() {
    let c = client().await;
    let q = queue_pair(&c, 2, 30).await;
    send(&c, &q.url, "{}", Some("evt-0"), "d-0", "g-1").await;
    // A signal each time a ReceiveMessage call leaves for moto.
    let (sent, mut polls) = tokio::sync::mpsc::unbounded_channel();
    let watched = hooked(&c, move |request, connector| {
        if operation(&request) == Some("ReceiveMessage") {
            let _ = sent.send(());
        }
        connector.call(request)
    });
    let opts = fast_options(30, &q.dlq).wait(Duration::from_secs(5));
    let mut r = SqsReceiver::connect(watched, &q.url, opts).await.unwrap();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut first = Vec::new();
    while first.is_empty() && tokio::time::Instant::now() < deadline {
        first = r.receive(10).await.expect("receive");
    }
    assert_eq!(first.iter().map(ce_id).collect::<Vec<_>>(), ["evt-0"]);
    let delivery = first.pop().unwrap();
    while polls.try_recv().is_ok() {}

    // The next receive's long poll is on its way when the delivery is released for a retry a second later.
    // (Released with no delay, moto's poll would not see it: moto copies the groups in flight when a poll starts
    // and looks again only on meeting a message whose visibility ran out while in flight.)
    let poll = tokio::spawn(async move {
        let got = r.receive(10).await;
        (r, got)
    });
    polls.recv().await.expect("the next receive's call");
    delivery
        .release(Duration::from_secs(1))
        .await
        .expect("release");
    let (mut r, got) = poll.await.unwrap();
    let got = got.expect("receive");
    assert_eq!(
        got.iter().map(ce_id).collect::<Vec<_>>(),
        ["evt-0"],
        "the released message, back in the poll, handed out by it"
    );
    assert_eq!(
        got[0].message().delivery_count,
        2,
        "its second receive (ApproximateReceiveCount), its second attempt"
    );
    for d in got {
        d.ack().await.expect("ack");
    }
    // Nothing was held or given back: the queue is empty, and the next receive finds nothing.
    assert!(r.receive(10).await.expect("receive").is_empty());
    assert_eq!(total(&c, &q.url).await, 0, "deleted");
    assert_eq!(total(&c, &q.dlq).await, 0, "not dead-lettered");
}
