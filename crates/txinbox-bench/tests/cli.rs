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

/// The partition benchmark's bookkeeping on a small load (its figures are not asserted: a timing is not a
/// test): every cycle drops its one loaded partition and leaves no expired marker and no dead tuple behind,
/// and every control's rotation drops nothing, or the control would measure a drop.
#[test]
fn the_partition_benchmark_drops_one_partition_a_cycle_and_none_in_its_controls() {
    let url = txinbox_testkit::pg_url();
    let (code, out, err) = bench(&[
        "--store",
        &url,
        "--purge-impact",
        "2000",
        "--partitioned",
        "--cycles",
        "2",
        "--seconds",
        "1",
        "--concurrency",
        "2",
        "--controls",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    let lines = |prefix: &str| -> Vec<String> {
        out.lines()
            .filter(|l| l.starts_with(prefix))
            .map(str::to_owned)
            .collect()
    };
    let drops = lines("purge_impact_partitioned ");
    let controls = lines("purge_impact_control ");
    assert_eq!(drops.len(), 2, "{out}");
    assert_eq!(controls.len(), 2, "{out}");
    for l in &drops {
        for field in ["partitions_dropped=1 ", "expired_left=0 ", "markers=2000 "] {
            assert!(l.contains(field), "{field}: {l}");
        }
        assert!(l.ends_with("dead_tuples=0"), "{l}");
    }
    for l in &controls {
        assert!(l.contains("partitions_dropped=0 "), "{l}");
    }
    // Odd cycles run the control first, even ones the drop first.
    let order: Vec<&str> = out
        .lines()
        .filter_map(|l| l.split_once(" cycle=").map(|(kind, _)| kind))
        .collect();
    assert_eq!(
        order,
        [
            "purge_impact_control",
            "purge_impact_partitioned",
            "purge_impact_partitioned",
            "purge_impact_control"
        ],
        "{out}"
    );
}

/// The DynamoDB benchmark's bookkeeping on DynamoDB Local (its figures are not asserted): every line of each
/// concurrency is printed, the batch line among them, and both of its tables are deleted at the end; a batch
/// over DynamoDB's 100 actions is refused before anything is created.
#[test]
fn the_dynamodb_benchmark_prints_its_lines_and_deletes_its_tables() {
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    });
    let prefix = format!(
        "benchtest{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let store = format!("dynamodb://{prefix}");
    let client = txinbox_dynamodb::emulator_client(&endpoint);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let tables = || {
        rt.block_on(client.list_tables().send())
            .unwrap()
            .table_names()
            .iter()
            .filter(|t| t.starts_with(&prefix))
            .cloned()
            .collect::<Vec<_>>()
    };

    let (code, out, err) = bench(&["--store", &store, "--batch", "51"]);
    assert_eq!(code, 2, "{err}\n{out}");
    assert!(err.contains("--batch 51 is over 50"), "{err}");
    assert_eq!(tables(), Vec::<String>::new());

    let (code, out, err) = bench(&[
        "--store",
        &store,
        "--seconds",
        "1",
        "--rounds",
        "1",
        "--concurrency",
        "2",
        "--batch",
        "3",
    ]);
    assert_eq!(code, 0, "{err}\n{out}");
    for line in [
        "c=2 put=",
        "#   c=2 marker_tx=",
        "#   c=2 pair_same_table=",
        "#   c=2 inbox_batch3=",
        "# write units per message on DynamoDB",
    ] {
        assert_eq!(
            out.lines().filter(|l| l.starts_with(line)).count(),
            1,
            "{line}: {out}"
        );
    }
    assert!(out.contains("inbox_batch3/same_tx_batch3="), "{out}");
    assert_eq!(tables(), Vec::<String>::new(), "both tables deleted");
}
