//! Property tests of what a Service Bus receive brings (`BrokerProperties`, custom-property headers, the lock
//! URI, `Retry-After`) and of quoting a property for a send. Fuzzed, coverage-guided, by
//! `fuzz/fuzz_targets/servicebus_wire.rs`.

use proptest::prelude::*;
use txinbox_core::BrokerErrorKind;
use txinbox_servicebus::wire::{self, BrokerProperties, ResponseHeaders};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// `BrokerProperties` text: the real shape with odd values, or anything.
fn broker_properties() -> impl Strategy<Value = String> {
    let field = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_map(|f| serde_json::json!(f).to_string()),
        any::<String>().prop_map(|s| serde_json::json!(s).to_string()),
        Just("null".to_owned()),
        Just("[]".to_owned()),
    ];
    let names = prop_oneof![
        Just("DeliveryCount"),
        Just("MessageId"),
        Just("SequenceNumber"),
        Just("LockedUntilUtc"),
        Just("EnqueuedTimeUtc"),
        Just("SessionId"),
        Just("TimeToLive"),
    ];
    prop_oneof![
        3 => proptest::collection::vec((names, field), 0..6).prop_map(|fields| {
            let body: Vec<String> = fields.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", body.join(","))
        }),
        1 => any::<String>(),
    ]
}

fn headers() -> impl Strategy<Value = ResponseHeaders> {
    (
        proptest::option::of(broker_properties()),
        proptest::option::of(prop_oneof![
            Just("https://ns.servicebus.windows.net/q/messages/31/7da9cfd5-40d5-4bb1-8d64-ec5a52e1c547".to_owned()),
            Just(String::new()),
            any::<String>(),
        ]),
        proptest::option::of(any::<String>()),
        proptest::collection::btree_map("[a-z-]{1,12}", any::<String>(), 0..5),
    )
        .prop_map(|(props, location, retry, custom)| {
            let mut h = ResponseHeaders::default();
            h.0.extend(custom);
            if let Some(p) = props {
                h.0.insert("brokerproperties".into(), p);
            }
            if let Some(l) = location {
                h.0.insert("location".into(), l);
            }
            if let Some(r) = retry {
                h.0.insert("retry-after".into(), r);
            }
            h
        })
}

proptest! {
    #![proptest_config(config())]

    /// Any answer is read or refused as a protocol error (no lock URI), never a panic; what is read keeps
    /// the body and the custom properties (unquoted), a delivery count of at least 1, no empty producer id.
    #[test]
    fn a_received_message_is_read_or_refused_as_a_protocol_error(h in headers(), body in any::<Vec<u8>>()) {
        match wire::received_message(&h, body.clone(), "q", chrono::Utc::now()) {
            Ok((m, _)) => {
                prop_assert_eq!(&m.body, &body);
                prop_assert!(m.delivery_count >= 1);
                prop_assert!(m.producer_id.as_deref().is_none_or(|id| !id.is_empty()));
                for (k, v) in &m.attributes {
                    prop_assert!(wire::is_custom_property(k));
                    prop_assert_eq!(v.as_str(), wire::unquote(h.get(k).unwrap()));
                }
            }
            Err(e) => {
                prop_assert_eq!(e.kind(), BrokerErrorKind::Protocol);
                prop_assert!(h.get("location").is_none_or(str::is_empty));
            }
        }
        if let Some(d) = wire::retry_after(&h) {
            prop_assert!(d.as_secs_f64().is_finite());
        }
    }

    /// Any `BrokerProperties` text parses or is refused as JSON, never a panic; its dates parse or are none.
    #[test]
    fn broker_properties_never_panic(raw in broker_properties()) {
        if let Ok(p) = BrokerProperties::parse(&raw) {
            let _ = (p.enqueued_at(), p.locked_until());
        }
    }

    /// A quoted property is quoted, without control characters, near its length limit (in bytes), and every
    /// character kept: a short value without quotes or control characters, non-ASCII included, survives
    /// quoting and unquoting.
    #[test]
    fn quoted_properties_are_safe_header_values(v in any::<String>(), max in 2usize..300) {
        let q = wire::quote_property(&v, max);
        prop_assert!(q.starts_with('"') && q.ends_with('"') && q.len() >= 2);
        prop_assert!(!q.chars().any(char::is_control));
        prop_assert!(q.len() <= max + 4 + 3 + 1);
        if v.len() < max && v.chars().all(|c| !c.is_control() && c != '"') {
            prop_assert_eq!(wire::unquote(&q), v.as_str());
        }
    }

    /// A lock URI's sequence number, when read, is a number that was in the URI.
    #[test]
    fn sequence_numbers_come_only_from_the_lock_uri(s in any::<String>(), n in any::<i64>()) {
        if let Some(seq) = wire::sequence_from_location(&s) {
            prop_assert!(seq.parse::<i64>().is_ok());
        }
        let uri = format!("https://ns/q/messages/{n}/token");
        prop_assert_eq!(wire::sequence_from_location(&uri), Some(n.to_string()));
    }
}
