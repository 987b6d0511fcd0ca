//! The `txinbox-bench` binary: its arguments and its errors.

use std::process::Command;

fn bench(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_txinbox-bench"))
        .args(args)
        .env_remove("TXINBOX_BENCH_STORE_URL")
        .output()
        .expect("run txinbox-bench");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_arguments_are_clear_errors() {
    let (code, _, err) = bench(&["--store", "sqlite::memory:"]);
    assert_eq!(code, 2);
    assert!(err.contains("postgres://"), "{err}");

    let (code, _, err) = bench(&[]);
    assert_eq!(code, 2);
    assert!(err.contains("--store <STORE>"), "{err}");
}

#[test]
fn help_lists_the_flags_of_the_benchmark() {
    let (code, out, err) = bench(&["--help"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Usage: txinbox-bench [OPTIONS] --store <STORE>"),
        "{out}"
    );
    for flag in [
        "--store",
        "--seconds",
        "--concurrency",
        "--rounds",
        "--pgbench",
        "--purge-impact",
        "--batch",
        "--e2e-messages",
        "--e2e-round-trip-ms",
        "--e2e-in-flight",
        "--e2e-receive-max",
        "--e2e-receivers",
        "--e2e-receive-loops",
        "--e2e-prefetch",
        "--e2e-rate",
        "--e2e-linger-ms",
        "--e2e-only",
    ] {
        assert!(
            out.contains(&format!("{flag} ")) || out.contains(&format!("{flag}\n")),
            "{flag}: {out}"
        );
    }
}
