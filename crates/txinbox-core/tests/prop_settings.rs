//! Property tests of the worker settings file (TOML) and its `TXINBOX_<SECTION>__<KEY>` overrides: any text
//! is read or refused with a typed error, never a panic; an override's value never appears in an error (it
//! may be a password). Fuzzed, coverage-guided, by `fuzz/fuzz_targets/worker_settings.rs`.

use proptest::prelude::*;
use txinbox_core::settings::{SettingsError, WorkerSettings};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 500,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// TOML-ish text: sections and keys of the real file with odd values, or anything.
fn toml_text() -> impl Strategy<Value = String> {
    let section = prop_oneof![
        Just("worker".to_owned()),
        Just("store".to_owned()),
        Just("inbox".to_owned()),
        Just("sqs".to_owned()),
        Just("servicebus".to_owned()),
        Just("nope".to_owned()),
    ];
    let key = prop_oneof![
        Just("consumer".to_owned()),
        Just("concurrency".to_owned()),
        Just("url".to_owned()),
        Just("retention_seconds".to_owned()),
        Just("visibility_timeout_seconds".to_owned()),
        Just("heartbeat_interval_seconds".to_owned()),
        Just("lock_duration_seconds".to_owned()),
        Just("dead_letter_to".to_owned()),
        Just("queue_url".to_owned()),
        "[a-z_]{1,12}",
    ];
    let value = prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<String>().prop_map(|s| format!("{s:?}")),
        Just("true".to_owned()),
        Just("[1, 2]".to_owned()),
        Just("1e400".to_owned()),
        any::<String>(),
    ];
    prop_oneof![
        4 => proptest::collection::vec((section, key, value), 0..8).prop_map(|items| {
            items
                .iter()
                .map(|(s, k, v)| format!("[{s}]\n{k} = {v}\n"))
                .collect::<String>()
        }),
        1 => any::<String>(),
    ]
}

proptest! {
    #![proptest_config(config())]

    /// Read, or refused as invalid (with where) or as a value out of range; reading twice agrees.
    #[test]
    fn any_settings_text_is_read_or_refused_with_a_typed_error(text in toml_text()) {
        match WorkerSettings::from_toml_str(&text) {
            Ok(s) => {
                let again = WorkerSettings::from_toml_str(&text).unwrap();
                prop_assert_eq!(format!("{s:?}"), format!("{again:?}"));
            }
            Err(e) => {
                prop_assert!(matches!(e, SettingsError::Invalid { .. } | SettingsError::Value { .. }), "{:?}", e);
                prop_assert!(!e.to_string().is_empty());
            }
        }
    }

    /// An override's value (it may be a password) is never in the error it causes.
    #[test]
    fn an_override_value_never_appears_in_an_error(
        section in prop_oneof![Just("WORKER".to_owned()), Just("STORE".to_owned()), Just("SQS".to_owned()), Just("NOPE".to_owned()), "[A-Z]{1,6}"],
        key in prop_oneof![Just("CONCURRENCY".to_owned()), Just("URL".to_owned()), Just("VISIBILITY_TIMEOUT_SECONDS".to_owned()), "[A-Z_]{1,10}"],
        secret in "[a-zA-Z0-9]{12,24}",
        shape in 0u8..3,
    ) {
        let value = match shape {
            0 => secret.clone(),
            1 => format!("postgres://u:{secret}@db/x"),
            _ => format!("[{secret}"),
        };
        let dir = std::env::temp_dir().join(format!("txinbox-prop-settings-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("worker.toml");
        std::fs::write(&file, "").unwrap();
        let var = format!("TXINBOX_{section}__{key}");
        if let Err(e) = WorkerSettings::load_with_env(&file, [(var, value)]) {
            let shown = format!("{e} {e:?}");
            prop_assert!(!shown.contains(&secret), "the value in {}", shown);
        }
    }
}
