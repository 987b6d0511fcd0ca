//! Payload fingerprint: SHA-256 over the canonical form of the relevant content.
//!
//! JSON bodies are canonicalised (object keys sorted, no insignificant whitespace, numbers and strings as
//! serde_json writes them) after removing the volatile fields the user names as JSON pointers
//! (`/meta/received_at`). Other bodies are hashed as raw bytes. The same logical content therefore has the
//! same fingerprint however the producer serialised it, and a changed relevant field changes it.

use sha2::{Digest, Sha256};

/// How payloads are fingerprinted.
#[derive(Clone, Debug, Default)]
pub struct FingerprintSpec {
    excluded: Vec<String>,
}

impl FingerprintSpec {
    /// Fingerprint everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// Exclude a volatile field, named as a JSON pointer (`/received_at`, `/meta/attempt`). Pointers that
    /// do not exist in a body are ignored.
    pub fn exclude(mut self, json_pointer: impl Into<String>) -> Self {
        self.excluded.push(json_pointer.into());
        self
    }

    /// The excluded pointers.
    pub fn excluded(&self) -> &[String] {
        &self.excluded
    }

    /// Hex SHA-256 of the canonical form of `body`.
    ///
    /// ```
    /// use txinbox_core::FingerprintSpec;
    /// let spec = FingerprintSpec::new().exclude("/received_at");
    /// let a = spec.fingerprint(br#"{"a":1,"b":[1,2],"received_at":"09:00"}"#);
    /// let b = spec.fingerprint(br#"{ "b": [1, 2], "a": 1, "received_at": "10:00" }"#);
    /// assert_eq!(a, b);
    /// assert_ne!(a, spec.fingerprint(br#"{"a":2,"b":[1,2]}"#));
    /// ```
    pub fn fingerprint(&self, body: &[u8]) -> String {
        match serde_json::from_slice::<serde_json::Value>(body) {
            Ok(value) => self.fingerprint_json(&value),
            Err(_) => {
                let mut hasher = Sha256::new();
                hasher.update(b"raw:");
                hasher.update(body);
                to_hex(&hasher.finalize())
            }
        }
    }

    /// The fingerprint of a body already parsed as JSON; equal to [`FingerprintSpec::fingerprint`] of its
    /// bytes, without parsing them again.
    pub fn fingerprint_json(&self, value: &serde_json::Value) -> String {
        // The canonical form is written into one buffer and hashed at once: cheaper than feeding the hash
        // piece by piece.
        let mut canonical = Vec::with_capacity(256);
        canonical.extend_from_slice(b"json:");
        if self.excluded.is_empty() {
            write_canonical(value, &mut canonical);
        } else {
            let mut value = value.clone();
            for p in &self.excluded {
                remove_pointer(&mut value, p);
            }
            write_canonical(&value, &mut canonical);
        }
        to_hex(&Sha256::digest(&canonical))
    }
}

/// Lower-case hex of `bytes`.
fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

fn remove_pointer(value: &mut serde_json::Value, pointer: &str) {
    let Some((parent, last)) = pointer.rsplit_once('/') else {
        return;
    };
    let last = last.replace("~1", "/").replace("~0", "~");
    let target = if parent.is_empty() {
        Some(value)
    } else {
        value.pointer_mut(parent)
    };
    match target {
        Some(serde_json::Value::Object(map)) => {
            map.remove(&last);
        }
        Some(serde_json::Value::Array(items)) => {
            if let Ok(i) = last.parse::<usize>() {
                if i < items.len() {
                    items.remove(i);
                }
            }
        }
        _ => {}
    }
}

fn write_canonical(value: &serde_json::Value, out: &mut Vec<u8>) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            out.push(b'{');
            // serde_json's map iterates in key order unless a crate in the build turns on its
            // `preserve_order` feature; sort only when the order is not already canonical.
            let sorted = map.keys().zip(map.keys().skip(1)).all(|(a, b)| a < b);
            if sorted {
                for (i, (k, v)) in map.iter().enumerate() {
                    write_entry(i, k, v, out);
                }
            } else {
                let mut entries: Vec<(&String, &Value)> = map.iter().collect();
                entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
                for (i, (k, v)) in entries.into_iter().enumerate() {
                    write_entry(i, k, v, out);
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            out.push(b'[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_canonical(v, out);
            }
            out.push(b']');
        }
        scalar => {
            // Writing into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut *out, scalar);
        }
    }
}

fn write_entry(i: usize, key: &str, value: &serde_json::Value, out: &mut Vec<u8>) {
    if i > 0 {
        out.push(b',');
    }
    let _ = serde_json::to_writer(&mut *out, key);
    out.push(b':');
    write_canonical(value, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let s = FingerprintSpec::new();
        assert_eq!(
            s.fingerprint(br#"{"x":{"b":1,"a":2}}"#),
            s.fingerprint(b"{ \"x\" : { \"a\" : 2 , \"b\" : 1 } }")
        );
    }

    #[test]
    fn nested_exclusion_and_raw_bodies() {
        let s = FingerprintSpec::new().exclude("/meta/attempt");
        assert_eq!(
            s.fingerprint(br#"{"q":10,"meta":{"attempt":1}}"#),
            s.fingerprint(br#"{"q":10,"meta":{"attempt":7}}"#)
        );
        assert_ne!(
            s.fingerprint(br#"{"q":10,"meta":{}}"#),
            s.fingerprint(br#"{"q":12,"meta":{}}"#)
        );
        // Non-JSON bodies hash as bytes; JSON is compared in canonical form.
        assert_eq!(s.fingerprint(b"\xff\x00"), s.fingerprint(b"\xff\x00"));
        assert_eq!(s.fingerprint(b"1 "), s.fingerprint(b"1"));
        assert_ne!(s.fingerprint(b"abc"), s.fingerprint(b"abd"));
        let body = br#"{"q":10,"meta":{"attempt":3}}"#;
        let parsed: serde_json::Value = serde_json::from_slice(body).unwrap();
        assert_eq!(s.fingerprint_json(&parsed), s.fingerprint(body));
    }

    #[test]
    fn fingerprints_are_stable_across_releases() {
        // Stored markers keep their hashes: the canonical form and its encoding must never change.
        // Reference values computed independently (Python: json.dumps(sort_keys, compact separators,
        // ensure_ascii=False), sha256 over "json:" + that).
        let s = FingerprintSpec::new();
        assert_eq!(
            s.fingerprint(
                "{\"b\":[1,2.5,null,true],\"a\":{\"z\":\"é\\n\\\"\",\"y\":-3}}".as_bytes()
            ),
            "94aef6438735c4dbecc3b6b75f7886e84be49a9d747faaadb41a950a0ac0862b"
        );
        assert_eq!(
            s.fingerprint(b"\xff\x00"),
            "4f681537b5d86101cb416a0236e4f653d1dc4383fb3a296fd837a7cf539b9a37"
        );
    }
}
