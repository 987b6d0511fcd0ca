//! Helpers shared by the integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// `infra/` at the workspace root.
pub fn infra() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../infra")
}

pub fn aws_sample() -> PathBuf {
    infra().join("aws-sqs-fifo")
}

pub fn dynamodb_sample() -> PathBuf {
    infra().join("aws-dynamodb")
}

pub fn azure_sample() -> PathBuf {
    infra().join("azure-servicebus")
}

/// A temporary directory, removed on drop.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "txinbox-infra-test-{}-{tag}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        TempDir(dir)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    pub fn write(&self, name: &str, text: &str) {
        std::fs::write(self.0.join(name), text).unwrap();
    }

    pub fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.0.join(name)).unwrap()
    }

    /// Replaces `from` (which must occur exactly once) by `to` in `name`.
    pub fn edit(&self, name: &str, from: &str, to: &str) {
        let text = self.read(name);
        assert_eq!(
            text.matches(from).count(),
            1,
            "{from:?} must occur once in {name}"
        );
        self.write(name, &text.replacen(from, to, 1));
    }

    /// Replaces the first `from` after `anchor` (e.g. a resource's first line) by `to` in `name`.
    pub fn edit_after(&self, name: &str, anchor: &str, from: &str, to: &str) {
        let text = self.read(name);
        let start = text
            .find(anchor)
            .unwrap_or_else(|| panic!("{anchor:?} is not in {name}"));
        let at = start
            + text[start..]
                .find(from)
                .unwrap_or_else(|| panic!("{from:?} is not after {anchor:?} in {name}"));
        self.write(
            name,
            &format!("{}{to}{}", &text[..at], &text[at + from.len()..]),
        );
    }

    /// 1-based line of the first line after `anchor` containing `needle`.
    pub fn line_after(&self, name: &str, anchor: &str, needle: &str) -> usize {
        let text = self.read(name);
        let start = text
            .lines()
            .position(|l| l.contains(anchor))
            .unwrap_or_else(|| panic!("{anchor:?} is not in {name}"));
        start
            + 1
            + text
                .lines()
                .skip(start)
                .position(|l| l.contains(needle))
                .unwrap_or_else(|| panic!("{needle:?} is not after {anchor:?} in {name}"))
    }

    /// 1-based line of the only line of `name` containing `needle`.
    pub fn line_of(&self, name: &str, needle: &str) -> usize {
        let text = self.read(name);
        let lines: Vec<usize> = text
            .lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .map(|(i, _)| i + 1)
            .collect();
        assert_eq!(
            lines.len(),
            1,
            "{needle:?} must be on exactly one line of {name}"
        );
        lines[0]
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A copy of a sample directory's `.tf` files.
pub fn copy_of(sample: &Path, tag: &str) -> TempDir {
    let tmp = TempDir::new(tag);
    for entry in std::fs::read_dir(sample).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "tf") {
            std::fs::copy(&path, tmp.0.join(path.file_name().unwrap())).unwrap();
        }
    }
    tmp
}
