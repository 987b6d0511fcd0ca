//! The canonical JSON fingerprint: never a panic; a JSON body has the same fingerprint however it is
//! written (compact, pretty, keys in another order), a non-JSON body is hashed as its bytes, and a changed
//! value changes it.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use txinbox_core::FingerprintSpec;
use txinbox_fuzz::Fields;

/// The same value with every object's keys in reverse order, written by hand (serde_json sorts its maps).
fn reversed(v: &Value, out: &mut String) {
    match v {
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().rev().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n ");
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push_str(" : ");
                reversed(v, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push_str("[ ");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(",\t");
                }
                reversed(v, out);
            }
            out.push_str(" ]");
        }
        other => out.push_str(&other.to_string()),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut f = Fields::new(data);
    let pointer = f.string();
    let body = f.rest();
    let plain = FingerprintSpec::new();
    let spec = FingerprintSpec::new().exclude(pointer);
    let fp = plain.fingerprint(body);
    assert_eq!(fp.len(), 64);
    let _ = spec.fingerprint(body);
    match serde_json::from_slice::<Value>(body) {
        Ok(v) => {
            assert_eq!(fp, plain.fingerprint_json(&v));
            // The same value written three ways (numbers written alike: serde_json's default float parsing
            // is not exact, so a number re-written differently may read back as its neighbour).
            let compact = serde_json::to_vec(&v).expect("a value serialises");
            let pretty = serde_json::to_vec_pretty(&v).expect("a value serialises");
            let mut rev = String::new();
            reversed(&v, &mut rev);
            let c = plain.fingerprint(&compact);
            assert_eq!(c, plain.fingerprint(&pretty), "pretty-printed");
            assert_eq!(
                c,
                plain.fingerprint(rev.as_bytes()),
                "keys reordered: {rev}"
            );
            assert_eq!(spec.fingerprint(&compact), spec.fingerprint(rev.as_bytes()));
            // Different content, different fingerprint.
            let wrapped = serde_json::json!({ "wrapped": v });
            assert_ne!(fp, plain.fingerprint_json(&wrapped));
        }
        Err(_) => {
            let mut other = body.to_vec();
            other.push(b' ');
            // A trailing space after a non-JSON body is content.
            if serde_json::from_slice::<Value>(&other).is_err() {
                assert_ne!(fp, plain.fingerprint(&other));
            }
        }
    }
});
