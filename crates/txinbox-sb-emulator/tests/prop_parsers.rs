//! Property tests of the emulator's parsers of what a client sends: the `Authorization` check (SAS and
//! bearer tokens) and the REST request parsing (route, `BrokerProperties`, custom-property headers, batch
//! bodies, the `timeout` query, TimeSpans), through the `fuzzing` entry points. Fuzzed, coverage-guided, by
//! `fuzz/fuzz_targets/{sas_token,emulator_request}.rs`.

use std::time::Duration;

use proptest::prelude::*;
use txinbox_sb_emulator::fuzzing::{self, check_authorization, sas_header, Parsed};

const NOW: i64 = 1_700_000_000;
const REASONS: [&str; 4] = [
    "MissingToken:",
    "InvalidToken:",
    "InvalidSignature:",
    "InvalidAudience:",
];

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 1000,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any header is accepted or refused with 401 and one of the fixed reasons.
    #[test]
    fn any_authorization_header_is_accepted_or_refused_with_a_reason(
        header in prop_oneof![
            any::<Vec<u8>>(),
            any::<String>().prop_map(|s| format!("SharedAccessSignature {s}").into_bytes()),
            "sr=[a-z%:/.]{0,20}&sig=[A-Za-z0-9%+/=]{0,20}&se=[0-9-]{0,12}&skn=[a-z]{0,8}"
                .prop_map(|s| format!("SharedAccessSignature {s}").into_bytes()),
        ],
        path in any::<String>(),
    ) {
        if let Err(r) = check_authorization(&header, &path, Some("127.0.0.1:1"), NOW, "rule", "a-key") {
            prop_assert_eq!(r.status, 401);
            prop_assert!(REASONS.iter().any(|p| r.detail.starts_with(p)), "{}", r.detail);
        }
    }

    /// A token signed with the key for a path covering the request is accepted until it expires; the wrong
    /// key, a past expiry or another entity is refused.
    #[test]
    fn signed_tokens_are_accepted_only_where_they_should_be(
        key in "[A-Za-z0-9+/=]{1,44}",
        rule in "[A-Za-z]{1,20}",
        entity in "[a-z][a-z0-9-]{0,20}",
        other in "[a-z][a-z0-9-]{0,20}",
        offset in -1000i64..100_000,
    ) {
        let resource = format!("https://{}/{entity}", fuzzing::NAMESPACE_HOST);
        let token = sas_header(&resource, &rule, &key, NOW + offset);
        let path = format!("/{entity}/messages/head");
        let got = check_authorization(token.as_bytes(), &path, None, NOW, &rule, &key);
        if offset >= 0 {
            prop_assert_eq!(got, Ok(()));
            let wrong = format!("{key}x");
            prop_assert!(check_authorization(token.as_bytes(), &path, None, NOW, &rule, &wrong).is_err());
            if other != entity && !other.starts_with(&format!("{entity}/")) {
                let elsewhere = format!("/{other}/messages");
                prop_assert!(check_authorization(token.as_bytes(), &elsewhere, None, NOW, &rule, &key).is_err());
            }
        } else {
            prop_assert!(got.unwrap_err().detail.contains("expired"));
        }
    }

    /// Any request is understood or refused with 400/405 and a detail; a receive never waits past the cap.
    #[test]
    fn any_request_is_understood_or_refused(
        method in prop_oneof![Just("POST".to_owned()), Just("DELETE".to_owned()), Just("PUT".to_owned()), Just("GET".to_owned()), "[A-Z]{1,8}"],
        path in prop_oneof![
            "/[a-z]{1,8}(/[a-zA-Z$]{1,8}){0,4}",
            any::<String>(),
        ],
        query in proptest::option::of(prop_oneof!["timeout=[0-9.e+-]{0,8}", any::<String>()]),
        batch in any::<bool>(),
        body in prop_oneof![
            any::<Vec<u8>>(),
            Just(br#"[{"Body":"x","BrokerProperties":{"MessageId":"m","TimeToLive":5},"UserProperties":{"p":1}}]"#.to_vec()),
            Just(br#"[{"BrokerProperties":{"TimeToLiveTimeSpan":"1.00:00:00","SessionId":"a","PartitionKey":"b"}}]"#.to_vec()),
        ],
        headers in proptest::collection::vec((any::<Vec<u8>>(), any::<Vec<u8>>()), 0..4),
    ) {
        let hs: Vec<(&[u8], &[u8])> = headers.iter().map(|(k, v)| (k.as_slice(), v.as_slice())).collect();
        let ct = batch.then_some("application/vnd.microsoft.servicebus.json");
        match fuzzing::parse_request(&method, &path, query.as_deref(), &hs, ct, &body) {
            Ok(Parsed::Receive { timeout, .. }) => prop_assert!(timeout <= Duration::from_secs(60)),
            Ok(Parsed::Send { messages, .. }) => prop_assert!(messages >= 1),
            Ok(_) => {}
            Err(r) => {
                prop_assert!(matches!(r.status, 400 | 405), "{:?}", r);
                prop_assert!(!r.detail.is_empty());
            }
        }
    }

    /// TimeSpans parse to what they say, or not at all; never a panic or an overflow.
    #[test]
    fn timespans_parse_exactly_or_not_at_all(d in 0u64..100_000, h in 0u64..24, m in 0u64..60, s in 0u64..60, junk in any::<String>()) {
        let text = format!("{d}.{h:02}:{m:02}:{s:02}");
        prop_assert_eq!(
            fuzzing::parse_timespan(&text),
            Some(Duration::from_secs(d * 86_400 + h * 3600 + m * 60 + s))
        );
        let _ = fuzzing::parse_timespan(&junk);
        let _ = fuzzing::parse_broker_properties(junk.as_bytes());
        let _ = fuzzing::property_round_trip(junk.as_bytes());
    }
}
