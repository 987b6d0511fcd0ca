//! Helpers shared by the fuzz targets: a fuzz input read as a sequence of fields.

/// Reads a fuzz input as fields: a field is the bytes up to the next `0xFF` (or the end); a flag or a small
/// number is one byte. Every input is a valid sequence, so libFuzzer's mutations all reach the code under
/// test.
pub struct Fields<'a> {
    rest: &'a [u8],
}

impl<'a> Fields<'a> {
    /// Fields of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { rest: data }
    }

    /// The next field's bytes.
    pub fn bytes(&mut self) -> &'a [u8] {
        match self.rest.iter().position(|b| *b == 0xFF) {
            Some(i) => {
                let (field, rest) = self.rest.split_at(i);
                self.rest = &rest[1..];
                field
            }
            None => std::mem::take(&mut self.rest),
        }
    }

    /// The next field as text (invalid UTF-8 replaced).
    pub fn string(&mut self) -> String {
        String::from_utf8_lossy(self.bytes()).into_owned()
    }

    /// One byte (0 once the input is used up).
    pub fn byte(&mut self) -> u8 {
        match self.rest.split_first() {
            Some((b, rest)) => {
                self.rest = rest;
                *b
            }
            None => 0,
        }
    }

    /// One flag.
    pub fn flag(&mut self) -> bool {
        self.byte() & 1 == 1
    }

    /// Whatever is left.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.rest)
    }

    /// Whether nothing is left.
    pub fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }
}
