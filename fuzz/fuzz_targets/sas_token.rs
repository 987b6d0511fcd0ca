//! The emulator's `Authorization` check (SAS tokens and bearer tokens): never a panic; any header is accepted
//! or refused with 401 and one of the fixed reasons (never the key or the signature); a token built from the
//! right key for a covering resource is accepted, and the same token with a wrong key, an expiry in the past
//! or a changed signature is refused.
#![no_main]

use libfuzzer_sys::fuzz_target;
use txinbox_fuzz::Fields;
use txinbox_sb_emulator::fuzzing::{self, check_authorization, sas_header};

const NOW: i64 = 1_700_000_000;

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let key_name = f.string();
    let key = f.string();
    let path = f.string();
    let request_host = f.flag().then(|| f.string());
    let expiry_offset = i64::from(f.byte()) - 64;
    let header = f.rest();
    match check_authorization(header, &path, request_host.as_deref(), NOW, &key_name, &key) {
        Ok(()) => {}
        Err(refused) => {
            assert_eq!(refused.status, 401);
            // One of the fixed reasons (the refusal carries no field, so it cannot echo a key or a signature).
            assert!(refused.detail.len() < 200);
            assert!(
                [
                    "MissingToken:",
                    "InvalidToken:",
                    "InvalidSignature:",
                    "InvalidAudience:"
                ]
                .iter()
                .any(|p| refused.detail.starts_with(p)),
                "{}",
                refused.detail
            );
        }
    }
    // A token the way a client signs it, for the namespace and the requested path.
    let resource = format!(
        "https://{}/{}",
        fuzzing::NAMESPACE_HOST,
        path.trim_matches('/')
    );
    let expiry = NOW + expiry_offset;
    let token = sas_header(&resource, &key_name, &key, expiry);
    let got = check_authorization(token.as_bytes(), &path, None, NOW, &key_name, &key);
    let plain = path
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '/' || c == '-');
    if expiry >= NOW && plain && key_name.chars().all(|c| c.is_ascii_alphanumeric()) {
        assert_eq!(got, Ok(()), "{token}");
        let wrong_key = format!("{key}x");
        assert!(
            check_authorization(token.as_bytes(), &path, None, NOW, &key_name, &wrong_key).is_err()
        );
        let tampered = token.replacen("sig=", "sig=A", 1);
        assert!(
            check_authorization(tampered.as_bytes(), &path, None, NOW, &key_name, &key).is_err()
        );
    }
    if expiry < NOW {
        assert!(got.is_err());
    }
});
