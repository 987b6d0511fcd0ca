//! A FIFO message that came without a receipt handle cannot be settled, but SQS holds it in flight all the same,
//! and its group behind it. AWS (SQS Developer Guide, "Interleaving multiple ordered message groups"): "When a
//! message with a specific MessageGroupId is being processed and is invisible, no other consumer can process
//! messages from that same group until the visibility timeout expires or the message is deleted." The receipt
//! handle is what a message is settled with (`Message`, `ReceiptHandle`: "An identifier associated with the act
//! of receiving the message. A new receipt handle is returned every time you receive a message. When deleting a
//! message, you provide the last received receipt handle to delete the message."). moto always returns the
//! handle, so a transport in front of it answers the first receive that brings messages itself, from what moto
//! gave, the first message without its handle.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_sqs::types::{Message, MessageSystemAttributeName};
use common::*;
use txinbox_core::{Delivery, Receiver};

/// A message as SQS's JSON protocol answers it, without its receipt handle when `handle` is false.
fn as_json(m: &Message, handle: bool) -> serde_json::Value {
    let attributes: serde_json::Map<String, serde_json::Value> = m
        .attributes()
        .into_iter()
        .flatten()
        .map(|(k, v)| (k.as_str().to_owned(), v.clone().into()))
        .collect();
    let message_attributes: serde_json::Map<String, serde_json::Value> = m
        .message_attributes()
        .into_iter()
        .flatten()
        .filter_map(|(k, v)| {
            let s = v.string_value()?;
            Some((
                k.clone(),
                serde_json::json!({"StringValue": s, "DataType": v.data_type()}),
            ))
        })
        .collect();
    let mut j = serde_json::json!({
        "MessageId": m.message_id(),
        "Body": m.body(),
        "Attributes": attributes,
        "MessageAttributes": message_attributes,
    });
    if handle {
        j["ReceiptHandle"] = m.receipt_handle().into();
    }
    j
}

/// `plain`, whose first `ReceiveMessage` that brings messages answers them without the receipt handle of the
/// one at `missing` (the receive itself reaches moto through `plain`, with the parameters the adapter sent);
/// every other call reaches moto as it is.
fn receipt_missing_at(plain: &aws_sdk_sqs::Client, missing: usize) -> aws_sdk_sqs::Client {
    let done = Arc::new(AtomicBool::new(false));
    let moto = plain.clone();
    hooked(plain, move |request, connector| {
        let strip = operation(&request) == Some("ReceiveMessage") && !done.load(Ordering::SeqCst);
        let body = json_body(&request);
        let (done, moto, connector) = (done.clone(), moto.clone(), connector.clone());
        HttpConnectorFuture::new(async move {
            if !strip {
                return connector.call(request).await;
            }
            let n = |k: &str| body[k].as_i64().map(|v| v as i32);
            let got = moto
                .receive_message()
                .queue_url(body["QueueUrl"].as_str().unwrap_or_default())
                .set_max_number_of_messages(n("MaxNumberOfMessages"))
                .set_wait_time_seconds(n("WaitTimeSeconds"))
                .set_visibility_timeout(n("VisibilityTimeout"))
                .message_system_attribute_names(MessageSystemAttributeName::All)
                .message_attribute_names("All")
                .send()
                .await
                .expect("moto receives");
            let msgs = got.messages.unwrap_or_default();
            if !msgs.is_empty() {
                done.store(true, Ordering::SeqCst);
            }
            let answer: Vec<_> = msgs
                .iter()
                .enumerate()
                .map(|(i, m)| as_json(m, i != missing))
                .collect();
            Ok(json_answer(200, &serde_json::json!({"Messages": answer})))
        })
    })
}

/// Sends `n` messages of one group (`evt-0`, `evt-1`, ...) to a fresh queue whose visibility timeout is 3 s,
/// receives them through a receiver whose first answer brings them all with the one at `missing` without its
/// receipt handle, and acknowledges each delivery as it is handed out; returns the order they were handed out
/// in, once each was handed out (at most a minute).
async fn handed_out(n: usize, missing: usize) -> Vec<String> {
    let plain = client().await;
    let q = queue_pair(&plain, 5, 3).await;
    for i in 0..n {
        send(
            &plain,
            &q.url,
            "{}",
            Some(&format!("evt-{i}")),
            &format!("d-{i}"),
            "g-1",
        )
        .await;
    }
    let mut r = fast_receiver(receipt_missing_at(&plain, missing), &q, 3).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut order: Vec<String> = Vec::new();
    while order.len() < n && tokio::time::Instant::now() < deadline {
        for d in r.receive(10).await.expect("receive") {
            let id = ce_id(&d);
            d.ack().await.expect("ack");
            if !order.contains(&id) {
                order.push(id);
            }
        }
    }
    assert_eq!(total(&plain, &q.url).await, 0, "all deleted: {order:?}");
    order
}

/// The first of two messages of one group comes without its receipt handle: the receiver cannot hand it out,
/// and it stays in flight at SQS until its visibility timeout. The second, in the same answer, was handed out
/// at once, its group free in the receiver's books: applied before the first, which came back later. It waits
/// behind the first, which comes back first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_without_a_receipt_handle_keeps_its_group_busy() {
    assert_eq!(
        handed_out(2, 0).await,
        ["evt-0", "evt-1"],
        "the group's order"
    );
}

/// The second of three comes without its receipt handle and is held behind the first: once the first was
/// settled, the receiver dropped it and handed out the third, while SQS held the second in flight.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_message_without_a_receipt_handle_keeps_its_group_busy() {
    assert_eq!(
        handed_out(3, 1).await,
        ["evt-0", "evt-1", "evt-2"],
        "the group's order"
    );
}
