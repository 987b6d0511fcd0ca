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
    /// use txinbox::FingerprintSpec;
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
                hex::encode(hasher.finalize())
            }
        }
    }

    /// The fingerprint of a body already parsed as JSON; equal to [`FingerprintSpec::fingerprint`] of its
    /// bytes, without parsing them again.
    pub fn fingerprint_json(&self, value: &serde_json::Value) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"json:");
        if self.excluded.is_empty() {
            write_canonical(value, &mut hasher);
        } else {
            let mut value = value.clone();
            for p in &self.excluded {
                remove_pointer(&mut value, p);
            }
            write_canonical(&value, &mut hasher);
        }
        hex::encode(hasher.finalize())
    }
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

/// Feeds what serde_json writes straight into the hash, without building strings.
struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn write_canonical(value: &serde_json::Value, out: &mut Sha256) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut entries: Vec<(&String, &Value)> = map.iter().collect();
            entries.sort_unstable_by(|a, b| a.0.cmp(b.0));
            out.update(b"{");
            for (i, (k, v)) in entries.into_iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                // Writing a string into a hash cannot fail.
                let _ = serde_json::to_writer(HashWriter(out), k);
                out.update(b":");
                write_canonical(v, out);
            }
            out.update(b"}");
        }
        Value::Array(items) => {
            out.update(b"[");
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.update(b",");
                }
                write_canonical(v, out);
            }
            out.update(b"]");
        }
        scalar => {
            let _ = serde_json::to_writer(HashWriter(out), scalar);
        }
    }
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
}
