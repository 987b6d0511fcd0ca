//! What an SQS receive brings, read into the broker-neutral message, and the dead-letter bookkeeping
//! attributes: never a panic; attribute names are lower-cased and values kept; a deduplication id equal to
//! the message id (AWS's replacement on the move to a FIFO DLQ) is never the producer id; a count or a
//! timestamp that is not a number is ignored (delivery count 1, no enqueue time); a dead-letter detail is cut
//! to 1 KiB on a character boundary.
#![no_main]

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use libfuzzer_sys::fuzz_target;
use txinbox_core::dead_letter;
use txinbox_fuzz::Fields;
use txinbox_sqs::aws_sdk_sqs;

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let message_id = f.flag().then(|| f.string());
    let dedup = f.flag().then(|| f.string());
    let count = f.string();
    let sent = f.string();
    let group = f.flag().then(|| f.string());
    let mut b = Message::builder()
        .set_message_id(message_id.clone())
        .receipt_handle("r")
        .attributes(
            MessageSystemAttributeName::ApproximateReceiveCount,
            count.clone(),
        )
        .attributes(MessageSystemAttributeName::SentTimestamp, sent.clone());
    if let Some(d) = &dedup {
        b = b.attributes(
            MessageSystemAttributeName::MessageDeduplicationId,
            d.clone(),
        );
    }
    if let Some(g) = &group {
        b = b.attributes(MessageSystemAttributeName::MessageGroupId, g.clone());
    }
    let n = f.byte() % 12;
    let mut names = Vec::new();
    for _ in 0..n {
        let name = f.string();
        let value = f.string();
        let attr = if f.flag() {
            MessageAttributeValue::builder()
                .data_type("String")
                .string_value(value.clone())
                .build()
        } else {
            MessageAttributeValue::builder()
                .data_type("Binary")
                .binary_value(aws_sdk_sqs::primitives::Blob::new(value.clone()))
                .build()
        };
        if let Ok(attr) = attr {
            names.push(name.clone());
            b = b.message_attributes(name, attr);
        }
    }
    let body = f.string();
    let m = b.body(body.clone()).build();
    let rm = txinbox_sqs::received_message(&m, chrono::Utc::now());
    assert_eq!(rm.body, body.as_bytes());
    assert!(rm.attributes.keys().all(|k| *k == k.to_lowercase()));
    for (k, v) in m.message_attributes().into_iter().flatten() {
        if let Some(s) = v.string_value() {
            // Two names differing only in case collapse into one lower-case attribute.
            let collides = names
                .iter()
                .filter(|n| n.to_lowercase() == k.to_lowercase())
                .count()
                > 1;
            assert!(collides || rm.attribute(&k.to_lowercase()) == Some(s));
        }
    }
    assert_eq!(rm.broker_id, message_id);
    match (&message_id, &dedup) {
        (Some(id), Some(d)) if !id.is_empty() && id == d => assert_eq!(rm.producer_id, None),
        _ => assert_eq!(rm.producer_id, dedup),
    }
    assert_eq!(rm.group_id, group);
    if count.parse::<u32>().is_err() {
        assert_eq!(rm.delivery_count, 1);
    }
    if sent.parse::<i64>().is_err() {
        assert_eq!(rm.enqueued_at, None);
    }
    let cut = dead_letter::truncate_detail(&body);
    assert!(cut.len() <= dead_letter::MAX_DETAIL_LEN && body.starts_with(cut));
    assert!(cut.len() == body.len() || cut.len() + 4 > dead_letter::MAX_DETAIL_LEN);
    for name in &names {
        let bookkeeping = dead_letter::is_bookkeeping(name);
        let lower = name.to_ascii_lowercase();
        assert_eq!(bookkeeping, lower.starts_with(dead_letter::PREFIX));
    }
});
