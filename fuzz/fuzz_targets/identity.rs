//! Identity resolution from CloudEvents attributes, structured CloudEvents bodies and broker ids: never a
//! panic; an identity is never built from an empty field, a field with control characters, a field over
//! 512 bytes, or the broker-assigned id unless allowed; every refusal is a typed identity reason.
#![no_main]

use libfuzzer_sys::fuzz_target;
use txinbox_core::{BadInput, ConsumerName, IdOrigin, IdentityPolicy, ReceivedMessage};
use txinbox_fuzz::Fields;

const NAMES: &[&str] = &[
    "ce-id",
    "ce-source",
    "ce-type",
    "ce-specversion",
    "ce-dataschema",
    "ce-contractversion",
    "ce-businesskey",
    "ce-tenantid",
];

fn valid(v: &str) -> bool {
    !v.trim().is_empty() && v.len() <= 512 && !v.chars().any(char::is_control)
}

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let n = f.byte() % 9;
    let mut attributes = Vec::new();
    for _ in 0..n {
        let pick = f.byte();
        let name = match NAMES.get(usize::from(pick) % 10) {
            Some(name) => (*name).to_owned(),
            None => f.string().to_lowercase(),
        };
        attributes.push((name, f.string()));
    }
    let producer_id = f.flag().then(|| f.string());
    let broker_id = f.flag().then(|| f.string());
    let allow_broker_id = f.flag();
    let mut msg = ReceivedMessage::new(f.rest().to_vec());
    msg.attributes.extend(attributes);
    msg.producer_id = producer_id;
    msg.broker_id = broker_id;
    let Ok(consumer) = ConsumerName::new("fuzz-consumer") else {
        unreachable!("a valid consumer name")
    };
    let policy = IdentityPolicy::new(consumer).allow_broker_id(allow_broker_id);
    match policy.resolve(&msg) {
        Ok(id) => {
            assert!(valid(&id.message_id), "message id {:?}", id.message_id);
            assert!(id.source.len() <= 512 && !id.source.chars().any(char::is_control));
            if let Some(k) = &id.business_key {
                assert!(valid(k), "business key {k:?}");
            }
            match id.origin {
                IdOrigin::CloudEventsAttributes => {
                    assert_eq!(msg.attribute("ce-id"), Some(id.message_id.as_str()));
                    assert_eq!(msg.attribute("ce-source"), Some(id.source.as_str()));
                }
                IdOrigin::CloudEventsBody => {
                    assert!(msg.attribute("ce-id").is_none());
                    let v: serde_json::Value =
                        serde_json::from_slice(&msg.body).expect("a structured event is JSON");
                    assert_eq!(v["id"].as_str(), Some(id.message_id.as_str()));
                    assert_eq!(v["source"].as_str(), Some(id.source.as_str()));
                    assert!(v["specversion"].is_string());
                }
                IdOrigin::ProducerId => {
                    assert_eq!(msg.producer_id.as_deref(), Some(id.message_id.as_str()));
                }
                IdOrigin::BrokerId => {
                    assert!(allow_broker_id, "the broker id is used only when allowed");
                    assert!(msg.producer_id.is_none());
                    assert_eq!(msg.broker_id.as_deref(), Some(id.message_id.as_str()));
                }
                other => panic!("unknown origin {other:?}"),
            }
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    BadInput::NoIdentity { .. }
                        | BadInput::InvalidIdentityField { .. }
                        | BadInput::BusinessKey { .. }
                ),
                "not an identity reason: {e:?}"
            );
            assert!(!e.to_string().is_empty());
        }
    }
});
