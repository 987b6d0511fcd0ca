//! What the unit tests share.

use std::path::{Path, PathBuf};

/// A workers' settings file of a test's own: `worker.toml` in a fresh folder, removed with the folder when
/// dropped.
pub struct SettingsFile {
    dir: PathBuf,
    path: PathBuf,
}

impl SettingsFile {
    /// Writes `toml` to a new settings file.
    pub fn new(toml: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("txinbox-cli-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("worker.toml");
        std::fs::write(&path, toml).unwrap();
        Self { dir, path }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SettingsFile {
    fn drop(&mut self) {
        std::fs::remove_dir_all(&self.dir).ok();
    }
}
