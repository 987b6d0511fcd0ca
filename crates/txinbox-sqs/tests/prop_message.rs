//! Property tests of what an SQS receive brings, read into the broker-neutral message, and of the dead-letter
//! bookkeeping names and details. Fuzzed, coverage-guided, by `fuzz/fuzz_targets/sqs_message.rs`.

use aws_sdk_sqs::types::{Message, MessageAttributeValue, MessageSystemAttributeName};
use proptest::prelude::*;
use txinbox_core::dead_letter;

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

fn text() -> impl Strategy<Value = String> {
    prop_oneof!["[0-9]{1,12}", "[a-zA-Z0-9-]{0,16}", any::<String>(),]
}

proptest! {
    #![proptest_config(config())]

    /// Never a panic; names lower-cased, values kept; a deduplication id equal to the message id (AWS's
    /// replacement on the move to a FIFO DLQ) is never the producer id; a count or a timestamp that is not
    /// a number is ignored.
    #[test]
    fn an_sqs_message_is_read_without_trusting_its_attributes(
        message_id in proptest::option::of(text()),
        dedup in proptest::option::of(text()),
        same in any::<bool>(),
        count in text(),
        sent in text(),
        attrs in proptest::collection::btree_map("[A-Za-z][A-Za-z0-9-]{0,10}", any::<String>(), 0..8),
        body in any::<String>(),
    ) {
        let dedup = if same { message_id.clone() } else { dedup };
        let mut b = Message::builder()
            .set_message_id(message_id.clone())
            .receipt_handle("r")
            .body(body.clone())
            .attributes(MessageSystemAttributeName::ApproximateReceiveCount, count.clone())
            .attributes(MessageSystemAttributeName::SentTimestamp, sent.clone());
        if let Some(d) = &dedup {
            b = b.attributes(MessageSystemAttributeName::MessageDeduplicationId, d.clone());
        }
        for (k, v) in &attrs {
            let a = MessageAttributeValue::builder().data_type("String").string_value(v).build().unwrap();
            b = b.message_attributes(k, a);
        }
        let m = txinbox_sqs::received_message(&b.build(), chrono::Utc::now());
        prop_assert_eq!(m.body_str(), Some(body.as_str()));
        for (k, v) in &attrs {
            let lower = k.to_lowercase();
            let collides = attrs.keys().filter(|o| o.to_lowercase() == lower).count() > 1;
            prop_assert!(collides || m.attribute(&lower) == Some(v.as_str()));
        }
        match (&message_id, &dedup) {
            (Some(id), Some(d)) if !id.is_empty() && id == d => prop_assert_eq!(&m.producer_id, &None),
            _ => prop_assert_eq!(&m.producer_id, &dedup),
        }
        if count.parse::<u32>().is_err() {
            prop_assert_eq!(m.delivery_count, 1);
        }
        if sent.parse::<i64>().is_err() {
            prop_assert_eq!(m.enqueued_at, None);
        }
    }

    /// A dead-letter detail is cut to 1 KiB on a character boundary, a prefix of the original; bookkeeping
    /// names are recognised in any case and nothing else is.
    #[test]
    fn dead_letter_bookkeeping_is_bounded(detail in any::<String>(), name in any::<String>()) {
        let cut = dead_letter::truncate_detail(&detail);
        prop_assert!(cut.len() <= dead_letter::MAX_DETAIL_LEN && detail.starts_with(cut));
        prop_assert!(cut.len() == detail.len() || cut.len() + 4 > dead_letter::MAX_DETAIL_LEN);
        prop_assert_eq!(
            dead_letter::is_bookkeeping(&name),
            name.to_ascii_lowercase().starts_with(dead_letter::PREFIX)
        );
        let upper = format!("TXINBOX-DLQ-{name}");
        prop_assert!(dead_letter::is_bookkeeping(&upper));
    }
}

/// SQS message attribute names are case-sensitive (AWS, `MessageAttributeNames`: "The name is case-sensitive
/// and must be unique among all attribute names for the message"), so one message can carry `ce-id` and
/// `CE-ID` with different values. The adapter reads names lower-cased; which of the two it keeps must not
/// depend on the order the SDK's map iterates in (random per map, so per read and per process): every read of
/// the message, on every redelivery and every worker, must resolve the same identity, or one message is
/// applied under two identities. The name already in lower case (the CloudEvents spelling) wins; among the
/// others the first by name.
#[test]
fn attribute_names_differing_only_in_case_resolve_the_same_way_on_every_read() {
    let value = |v: &str| {
        MessageAttributeValue::builder()
            .data_type("String")
            .string_value(v)
            .build()
            .unwrap()
    };
    let read = |names: &[(&str, &str)]| {
        let mut b = Message::builder()
            .message_id("m-1")
            .receipt_handle("r")
            .body("{}");
        for (k, v) in names {
            b = b.message_attributes(*k, value(v));
        }
        // A new map per build: a new random iteration order, as each receive has.
        txinbox_sqs::received_message(&b.build(), chrono::Utc::now())
    };
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let m = read(&[
            ("CE-ID", "evt-upper"),
            ("ce-id", "evt-lower"),
            ("Ce-Id", "evt-mixed"),
            ("ce-source", "urn:crm"),
        ]);
        seen.insert(m.attribute("ce-id").map(str::to_owned));
    }
    assert_eq!(
        seen,
        [Some("evt-lower".to_owned())].into(),
        "the ce-id read from one message changed between reads"
    );
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..64 {
        let m = read(&[("Ce-Id", "evt-mixed"), ("CE-ID", "evt-upper")]);
        seen.insert(m.attribute("ce-id").map(str::to_owned));
    }
    assert_eq!(
        seen,
        [Some("evt-upper".to_owned())].into(),
        "without a lower-case spelling, the first name in order wins (\"CE-ID\" < \"Ce-Id\")"
    );
}
