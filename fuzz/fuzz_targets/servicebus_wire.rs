//! What a Service Bus receive brings: `BrokerProperties`, custom-property headers, `Location`, `Retry-After`.
//! Never a panic; a message is either read (delivery count at least 1, no empty producer id, property names
//! and values as received, unquoted) or refused as a protocol error (no lock URI); quoting for a send never
//! leaves a control character or an inner quote in a header value, keeps every other character as it was
//! (non-ASCII included, as UTF-8) and stays near its length limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use txinbox_core::BrokerErrorKind;
use txinbox_fuzz::Fields;
use txinbox_servicebus::wire::{self, BrokerProperties, ResponseHeaders};

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let mut headers = ResponseHeaders::default();
    let props = f.string();
    if f.flag() {
        headers.0.insert("brokerproperties".into(), props.clone());
    }
    let _ = BrokerProperties::parse(&props).map(|p| (p.enqueued_at(), p.locked_until()));
    let location = f.string();
    if f.flag() {
        headers.0.insert("location".into(), location.clone());
    }
    let retry = f.string();
    headers.0.insert("retry-after".into(), retry);
    let n = f.byte() % 8;
    for _ in 0..n {
        let name = f.string().to_ascii_lowercase();
        let value = f.string();
        headers.0.insert(name, value);
    }
    let body = f.rest().to_vec();
    if let Some(d) = wire::retry_after(&headers) {
        assert!(d.as_secs_f64().is_finite());
    }
    let _ = wire::sequence_from_location(&location);
    match wire::received_message(&headers, body.clone(), "fuzz-queue", chrono::Utc::now()) {
        Ok((m, p)) => {
            assert!(m.delivery_count >= 1);
            assert_eq!(m.body, body);
            assert!(m.producer_id.as_deref().is_none_or(|id| !id.is_empty()));
            if let Some(id) = &p.message_id {
                assert!(id.is_empty() || m.producer_id.as_deref() == Some(id.as_str()));
            }
            for (k, v) in &m.attributes {
                assert!(wire::is_custom_property(k));
                let raw = headers.get(k).expect("an attribute comes from a header");
                assert_eq!(v, wire::unquote(raw));
            }
        }
        Err(e) => {
            assert_eq!(e.kind(), BrokerErrorKind::Protocol);
            assert!(headers.get("location").is_none_or(str::is_empty));
        }
    }
    let max = usize::from(f.byte()).max(2);
    let q = wire::quote_property(&props, max);
    assert!(q.len() >= 2 && q.starts_with('"') && q.ends_with('"'), "{q:?}");
    let inner = &q[1..q.len() - 1];
    assert!(
        !inner.contains('"') && !q.chars().any(char::is_control),
        "{q:?}"
    );
    // The value as it was, a quote made `'` and a control character a space, up to the cut (`...`).
    let mapped: String = props
        .chars()
        .map(|c| match c {
            '"' => '\'',
            c if c.is_control() => ' ',
            c => c,
        })
        .collect();
    assert!(
        mapped.starts_with(inner)
            || inner
                .strip_suffix("...")
                .is_some_and(|kept| mapped.starts_with(kept)),
        "{q:?} from {props:?}"
    );
    // At most `max`, plus one character (4 bytes of UTF-8), the `...` and the closing quote.
    assert!(q.len() <= max + 4 + 3 + 1, "{} > {max}", q.len());
});
