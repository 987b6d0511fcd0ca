//! The emulator's REST request parsing (route, `BrokerProperties`, custom-property headers, batch bodies,
//! the `timeout` query, TimeSpans): never a panic; a request is understood or refused with 400 or 405 and a
//! detail; a receive's wait never exceeds the cap.
#![no_main]

use std::time::Duration;

use libfuzzer_sys::fuzz_target;
use txinbox_fuzz::Fields;
use txinbox_sb_emulator::fuzzing::{self, Parsed};

const METHODS: &[&str] = &["POST", "DELETE", "PUT", "GET", "PATCH"];

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let method = METHODS[usize::from(f.byte()) % METHODS.len()];
    let path = f.string();
    let query = f.flag().then(|| f.string());
    let content_type = f.flag().then(|| f.string());
    let n = f.byte() % 6;
    let mut raw_headers = Vec::new();
    for _ in 0..n {
        raw_headers.push((f.bytes(), f.bytes()));
    }
    let body = f.rest();
    match fuzzing::parse_request(
        method,
        &path,
        query.as_deref(),
        &raw_headers,
        content_type.as_deref(),
        body,
    ) {
        Ok(Parsed::Receive { timeout, entity }) => {
            assert!(timeout <= Duration::from_secs(60));
            assert!(!entity.is_empty() || path.trim_matches('/').starts_with("messages"));
        }
        Ok(Parsed::Send { messages, .. }) => assert!(messages >= 1),
        Ok(_) => {}
        Err(refused) => {
            assert!(matches!(refused.status, 400 | 405), "{refused:?}");
            assert!(!refused.detail.is_empty());
        }
    }
    for (_, value) in &raw_headers {
        let header = fuzzing::property_round_trip(value);
        assert!(!header.contains('\n') || String::from_utf8_lossy(value).contains('\n'));
    }
    let _ = fuzzing::parse_timespan(&String::from_utf8_lossy(body));
    let _ = fuzzing::parse_broker_properties(body);
});
