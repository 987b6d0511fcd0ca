//! What the tests of the `txinbox` binary share.

// Each test file uses what it needs of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `txinbox` binary with `args`, without the caller's TXINBOX_STORE_URL (the workers' store for the
/// operator commands).
pub fn txinbox_command(args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_txinbox"));
    command.args(args).env_remove("TXINBOX_STORE_URL");
    command
}

/// Runs `command` to its end: (exit code, stdout, stderr).
pub fn outcome(command: &mut Command) -> (i32, String, String) {
    let out = command.output().expect("run txinbox");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A fresh folder of its own for a test (removed by the test).
pub fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("txinbox-cli-{name}-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a workers' settings file, `worker.toml` in `dir`, holding `toml`: its path.
pub fn settings_file(dir: &Path, toml: &str) -> PathBuf {
    let path = dir.join("worker.toml");
    std::fs::write(&path, toml).unwrap();
    path
}
