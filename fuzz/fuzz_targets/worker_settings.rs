//! The worker settings file (TOML, the file both the workers and check-infra read): never a panic; read, or
//! refused as invalid (bad TOML, an unknown key, a wrong type) or as a value out of range; reading the same
//! text twice agrees.
#![no_main]

use libfuzzer_sys::fuzz_target;
use txinbox_core::settings::{SettingsError, WorkerSettings};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match WorkerSettings::from_toml_str(text) {
        Ok(s) => {
            let again = WorkerSettings::from_toml_str(text).expect("parsed once");
            assert_eq!(format!("{s:?}"), format!("{again:?}"));
        }
        Err(e) => {
            assert!(
                matches!(
                    e,
                    SettingsError::Invalid { .. } | SettingsError::Value { .. }
                ),
                "{e:?}"
            );
            assert!(!e.to_string().is_empty());
        }
    }
});
