//! The worker settings file of check-infra (TOML): never a panic; parsed or refused with a TOML error that
//! says where.
#![no_main]

use libfuzzer_sys::fuzz_target;
use txinbox_infra::WorkerSettings;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match WorkerSettings::from_toml_str(text) {
        Ok(s) => {
            // Parsing what was parsed is stable.
            let again = WorkerSettings::from_toml_str(text).expect("parsed once");
            assert_eq!(format!("{s:?}"), format!("{again:?}"));
        }
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
