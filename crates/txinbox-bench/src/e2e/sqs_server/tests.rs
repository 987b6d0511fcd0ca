use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_sqs::types::{
    DeleteMessageBatchRequestEntry, MessageAttributeValue, MessageSystemAttributeName,
    QueueAttributeName, SendMessageBatchRequestEntry,
};
use aws_sdk_sqs::Client;
use txinbox_core::{Delivery, Receiver};

use super::SqsServer;

async fn fifo_queue(client: &Client, name: &str) -> String {
    client
        .create_queue()
        .queue_name(name)
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .send()
        .await
        .unwrap()
        .queue_url()
        .unwrap()
        .to_owned()
}

fn entry(id: &str, body: &str, group: &str, dedup: &str) -> SendMessageBatchRequestEntry {
    SendMessageBatchRequestEntry::builder()
        .id(id)
        .message_body(body)
        .message_group_id(group)
        .message_deduplication_id(dedup)
        .message_attributes(
            "ce-id",
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(dedup)
                .build()
                .unwrap(),
        )
        .build()
        .unwrap()
}

async fn send(client: &Client, url: &str, entries: Vec<SendMessageBatchRequestEntry>) {
    let out = client
        .send_message_batch()
        .queue_url(url)
        .set_entries(Some(entries))
        .send()
        .await
        .unwrap();
    assert!(out.failed().is_empty(), "{:?}", out.failed());
}

/// One `SendMessage` (not a batch): its answer.
async fn send_one(
    client: &Client,
    url: &str,
    body: &str,
    group: &str,
    dedup: &str,
) -> aws_sdk_sqs::operation::send_message::SendMessageOutput {
    client
        .send_message()
        .queue_url(url)
        .message_body(body)
        .message_group_id(group)
        .message_deduplication_id(dedup)
        .send()
        .await
        .unwrap()
}

async fn receive(
    client: &Client,
    url: &str,
    max: i32,
    visibility: i32,
) -> Vec<aws_sdk_sqs::types::Message> {
    client
        .receive_message()
        .queue_url(url)
        .max_number_of_messages(max)
        .visibility_timeout(visibility)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .message_attribute_names("All")
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default()
}

/// Every attribute of the queue, as `GetQueueAttributes` with `All` answers them.
async fn all_attributes(client: &Client, url: &str) -> HashMap<QueueAttributeName, String> {
    client
        .get_queue_attributes()
        .queue_url(url)
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap()
        .attributes
        .unwrap_or_default()
}

fn sys(m: &aws_sdk_sqs::types::Message, k: MessageSystemAttributeName) -> Option<String> {
    m.attributes().and_then(|a| a.get(&k)).cloned()
}

#[tokio::test]
async fn a_batch_sent_is_received_in_order_with_its_attributes() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "orders.fifo").await;
    assert_eq!(
        client
            .get_queue_url()
            .queue_name("orders.fifo")
            .send()
            .await
            .unwrap()
            .queue_url(),
        Some(url.as_str())
    );
    let out = client
        .send_message_batch()
        .queue_url(&url)
        .entries(entry("0", "first", "g", "d-0"))
        .entries(entry("1", "second", "g", "d-1"))
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful().len(), 2);
    assert_eq!(
        out.successful()[0].md5_of_message_body(),
        "8b04d5e3775d298e78455efc5ca404d5"
    );
    let got = receive(&client, &url, 10, 30).await;
    assert_eq!(got.len(), 2);
    assert_eq!(got[0].body(), Some("first"));
    assert_eq!(got[1].body(), Some("second"));
    assert_eq!(
        got[0].md5_of_body(),
        Some("8b04d5e3775d298e78455efc5ca404d5")
    );
    assert_eq!(got[0].message_id(), Some(out.successful()[0].message_id()));
    let m = &got[0];
    use MessageSystemAttributeName as A;
    assert_eq!(sys(m, A::MessageGroupId).as_deref(), Some("g"));
    assert_eq!(sys(m, A::MessageDeduplicationId).as_deref(), Some("d-0"));
    assert_eq!(sys(m, A::ApproximateReceiveCount).as_deref(), Some("1"));
    for a in [
        A::SentTimestamp,
        A::ApproximateFirstReceiveTimestamp,
        A::SequenceNumber,
        A::SenderId,
    ] {
        assert!(sys(m, a.clone()).is_some(), "{a:?}");
    }
    assert_eq!(
        m.message_attributes().unwrap()["ce-id"].string_value(),
        Some("d-0")
    );
    let rm = txinbox_sqs::received_message(m, chrono::Utc::now());
    assert_eq!(rm.attributes.get("ce-id").map(String::as_str), Some("d-0"));
    assert_eq!(rm.group_id.as_deref(), Some("g"));
    assert!(rm.enqueued_at.is_some());
    // Both in flight: counted as such.
    let a = all_attributes(&client, &url).await;
    assert_eq!(a[&QueueAttributeName::FifoQueue], "true");
    assert_eq!(a[&QueueAttributeName::VisibilityTimeout], "60");
    assert_eq!(a[&QueueAttributeName::ApproximateNumberOfMessages], "0");
    assert_eq!(
        a[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible],
        "2"
    );
    assert!(!a.contains_key(&QueueAttributeName::RedrivePolicy));
    // An empty long poll waits, and answers nothing.
    let t = std::time::Instant::now();
    let empty = client
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(1)
        .send()
        .await
        .unwrap();
    assert!(empty.messages().is_empty());
    assert!(t.elapsed() >= Duration::from_millis(900));
    // A missing queue is the SDK's QueueDoesNotExist.
    let e = client
        .get_queue_attributes()
        .queue_url(format!("{}/000000000000/nope.fifo", server.url))
        .attribute_names(QueueAttributeName::All)
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(e.is_queue_does_not_exist(), "{e:?}");
    client.delete_queue().queue_url(&url).send().await.unwrap();
    let e = client
        .get_queue_url()
        .queue_name("orders.fifo")
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(e.is_queue_does_not_exist(), "{e:?}");
}

#[tokio::test]
async fn a_group_is_blocked_while_one_of_its_messages_is_in_flight() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "groups.fifo").await;
    send(
        &client,
        &url,
        vec![
            entry("0", "a1", "a", "a1"),
            entry("1", "b1", "b", "b1"),
            entry("2", "a2", "a", "a2"),
            entry("3", "b2", "b", "b2"),
        ],
    )
    .await;
    // One message: a1. Group a is now blocked; the next receive takes all of b, oldest first.
    let first = receive(&client, &url, 1, 30).await;
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].body(), Some("a1"));
    let second = receive(&client, &url, 10, 30).await;
    let bodies: Vec<_> = second.iter().filter_map(|m| m.body()).collect();
    assert_eq!(bodies, ["b1", "b2"]);
    assert!(receive(&client, &url, 10, 30).await.is_empty());
    // Deleting a1 frees group a: a2 comes next.
    client
        .delete_message()
        .queue_url(&url)
        .receipt_handle(first[0].receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    let third = receive(&client, &url, 10, 30).await;
    let bodies: Vec<_> = third.iter().filter_map(|m| m.body()).collect();
    assert_eq!(bodies, ["a2"]);
    // A receive takes as many of one group as it can before the next group.
    send(
        &client,
        &url,
        vec![
            entry("0", "c1", "c", "c1"),
            entry("1", "d1", "d", "d1"),
            entry("2", "c2", "c", "c2"),
        ],
    )
    .await;
    let fourth = receive(&client, &url, 10, 30).await;
    let bodies: Vec<_> = fourth.iter().filter_map(|m| m.body()).collect();
    assert_eq!(bodies, ["c1", "c2", "d1"]);
}

#[tokio::test]
async fn an_expired_visibility_makes_the_message_available_again_under_a_new_handle() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "expiry.fifo").await;
    send(&client, &url, vec![entry("0", "x", "g", "x")]).await;
    let first = receive(&client, &url, 1, 1).await;
    assert_eq!(first.len(), 1);
    let old = first[0].receipt_handle().unwrap().to_owned();
    assert!(receive(&client, &url, 1, 1).await.is_empty());
    // A long poll sees the message come back when its visibility runs out.
    let again = client
        .receive_message()
        .queue_url(&url)
        .wait_time_seconds(3)
        .visibility_timeout(30)
        .message_system_attribute_names(MessageSystemAttributeName::All)
        .send()
        .await
        .unwrap()
        .messages
        .unwrap_or_default();
    assert_eq!(again.len(), 1);
    assert_eq!(
        sys(
            &again[0],
            MessageSystemAttributeName::ApproximateReceiveCount
        )
        .as_deref(),
        Some("2")
    );
    let new = again[0].receipt_handle().unwrap().to_owned();
    assert_ne!(old, new);
    let e = client
        .delete_message()
        .queue_url(&url)
        .receipt_handle(&old)
        .send()
        .await
        .unwrap_err()
        .into_service_error();
    assert!(e.is_receipt_handle_is_invalid(), "{e:?}");
    // The old handle cannot change its visibility either; the new one can.
    assert!(client
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(&old)
        .visibility_timeout(0)
        .send()
        .await
        .is_err());
    client
        .change_message_visibility()
        .queue_url(&url)
        .receipt_handle(&new)
        .visibility_timeout(0)
        .send()
        .await
        .unwrap();
    let third = receive(&client, &url, 1, 30).await;
    assert_eq!(
        sys(
            &third[0],
            MessageSystemAttributeName::ApproximateReceiveCount
        )
        .as_deref(),
        Some("3")
    );
    client
        .delete_message()
        .queue_url(&url)
        .receipt_handle(third[0].receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    assert!(receive(&client, &url, 1, 1).await.is_empty());
}

#[tokio::test]
async fn a_second_send_with_the_same_deduplication_id_is_dropped() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "dedup.fifo").await;
    let first = send_one(&client, &url, "one", "g", "same").await;
    let second = send_one(&client, &url, "two", "g", "same").await;
    assert_eq!(first.message_id(), second.message_id());
    let got = receive(&client, &url, 10, 30).await;
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].body(), Some("one"));
    // Still dropped after the first was deleted (within the 5-minute window).
    client
        .delete_message()
        .queue_url(&url)
        .receipt_handle(got[0].receipt_handle().unwrap())
        .send()
        .await
        .unwrap();
    send(&client, &url, vec![entry("0", "three", "g", "same")]).await;
    assert!(receive(&client, &url, 10, 30).await.is_empty());
}

#[tokio::test]
async fn a_delete_batch_answers_each_entry() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "batch.fifo").await;
    send(&client, &url, vec![entry("0", "x", "g", "x")]).await;
    let got = receive(&client, &url, 10, 30).await;
    let out = client
        .delete_message_batch()
        .queue_url(&url)
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("good")
                .receipt_handle(got[0].receipt_handle().unwrap())
                .build()
                .unwrap(),
        )
        .entries(
            DeleteMessageBatchRequestEntry::builder()
                .id("bad")
                .receipt_handle("no-such-handle")
                .build()
                .unwrap(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(out.successful().len(), 1);
    assert_eq!(out.successful()[0].id(), "good");
    assert_eq!(out.failed().len(), 1);
    assert_eq!(out.failed()[0].id(), "bad");
    assert_eq!(out.failed()[0].code(), "ReceiptHandleIsInvalid");
    assert!(out.failed()[0].sender_fault());
    let attrs = client
        .get_queue_attributes()
        .queue_url(&url)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessages)
        .attribute_names(QueueAttributeName::ApproximateNumberOfMessagesNotVisible)
        .send()
        .await
        .unwrap();
    let a = attrs.attributes().unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!(a[&QueueAttributeName::ApproximateNumberOfMessages], "0");
    assert_eq!(
        a[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible],
        "0"
    );
}

#[tokio::test]
async fn an_unknown_action_is_invalid() {
    let server = SqsServer::start().await.unwrap();
    let r = reqwest::Client::new()
        .post(&server.url)
        .header("x-amz-target", "AmazonSQS.TagQueue")
        .header("content-type", "application/x-amz-json-1.0")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = serde_json::from_slice(&r.bytes().await.unwrap()).unwrap();
    assert_eq!(v["__type"], "com.amazonaws.sqs#InvalidAction");
}

/// The adapter connects; its start-up check passes on a queue with a `RedrivePolicy` (the dead-letter queue
/// is found through `GetQueueUrl`), and on a FIFO queue without one only with `allow_no_dead_letter`, as it
/// would on SQS. Its receive and ack go through.
#[tokio::test]
async fn the_adapter_connects_receives_and_deletes() {
    let server = SqsServer::start().await.unwrap();
    let client = txinbox_sqs::emulator_client(&server.url);
    let url = fifo_queue(&client, "adapter.fifo").await;
    let opts = txinbox_sqs::SqsOptions::default().wait(Duration::from_secs(1));
    let mut receiver = txinbox_sqs::SqsReceiver::connect(client.clone(), &url, opts.clone())
        .await
        .unwrap();
    assert_eq!(receiver.dead_letter_queue(), None);
    let e = receiver.check().await.unwrap_err();
    assert_eq!(e.kind(), txinbox_core::BrokerErrorKind::Configuration);
    let mut allowed = txinbox_sqs::SqsReceiver::connect(
        client.clone(),
        &url,
        opts.clone().allow_no_dead_letter(true),
    )
    .await
    .unwrap();
    allowed.check().await.unwrap();

    let dlq = fifo_queue(&client, "adapter-dlq.fifo").await;
    let with_dlq = client
            .create_queue()
            .queue_name("adapter-main.fifo")
            .attributes(QueueAttributeName::FifoQueue, "true")
            .attributes(
                QueueAttributeName::RedrivePolicy,
                r#"{"deadLetterTargetArn":"arn:aws:sqs:us-east-1:000000000000:adapter-dlq.fifo","maxReceiveCount":"5"}"#,
            )
            .send()
            .await
            .unwrap()
            .queue_url()
            .unwrap()
            .to_owned();
    let mut r = txinbox_sqs::SqsReceiver::connect(client.clone(), &with_dlq, opts)
        .await
        .unwrap();
    assert_eq!(r.dead_letter_queue(), Some(dlq.as_str()));
    r.check().await.unwrap();

    send(
        &client,
        &url,
        vec![entry("0", "a", "g1", "a"), entry("1", "b", "g2", "b")],
    )
    .await;
    let got = receiver.receive(10).await.unwrap();
    assert_eq!(got.len(), 2);
    for d in got {
        d.ack().await.unwrap();
    }
    let a = all_attributes(&client, &url).await;
    assert_eq!(a[&QueueAttributeName::ApproximateNumberOfMessages], "0");
    assert_eq!(
        a[&QueueAttributeName::ApproximateNumberOfMessagesNotVisible],
        "0"
    );
}
