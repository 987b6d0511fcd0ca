//! Unit tests of the pgbench scripts.

/// The pgbench script is the store's own statement with every parameter given a value of the same shape:
/// a placeholder left over would mean the statement changed under the benchmark.
#[test]
fn the_pgbench_script_binds_every_parameter_of_the_store_statement() {
    let script = script_of(0, false);
    assert!(!script.contains('$'), "{script}");
    assert!(script.contains("ON CONFLICT DO NOTHING"), "{script}");
    assert_eq!(script.matches("INSERT INTO").count(), 2, "{script}");
    assert!(!script.contains("SAVEPOINT"), "{script}");
}

/// The batched script sends what a batch's first pass sends: the store's one statement for every marker
/// (each of its thirteen arrays of ten values), then each message's business insert, one COMMIT, every
/// message id distinct.
#[test]
fn the_batched_pgbench_script_sends_what_a_batch_sends() {
    let script = script_of(10, false);
    assert!(!script.contains('$'), "{script}");
    assert!(!script.contains("SAVEPOINT"), "{script}");
    assert_eq!(script.matches("unnest(ARRAY[").count(), 1, "{script}");
    assert_eq!(script.matches("ARRAY[").count(), 13, "{script}");
    assert_eq!(script.matches("INSERT INTO txinbox_inbox").count(), 1);
    assert_eq!(script.matches("INSERT INTO bench_tasks").count(), 10);
    assert_eq!(script.matches("COMMIT").count(), 1, "{script}");
    for k in 0..10 {
        // In the markers' array of ids, and twice in its business insert (task id, message id).
        assert_eq!(script.matches(&format!("|| '-{k}'")).count(), 3, "{script}");
    }
}

/// The savepoint pass's script: per message the store's savepoint, its marker insert and the business
/// insert, one COMMIT.
#[test]
fn the_savepoint_pgbench_script_sends_what_the_savepoint_pass_sends() {
    let script = script_of(10, true);
    assert!(!script.contains('$'), "{script}");
    assert_eq!(script.matches("SAVEPOINT txinbox_delivery").count(), 10);
    assert_eq!(script.matches("INSERT INTO").count(), 20, "{script}");
    assert_eq!(script.matches("COMMIT").count(), 1, "{script}");
    for k in 0..10 {
        assert_eq!(script.matches(&format!("|| '-{k}'")).count(), 3, "{script}");
    }
}

fn script_of(batch: usize, savepoints: bool) -> String {
    let path = super::pgbench_script(&std::env::temp_dir(), batch, savepoints).unwrap();
    let script = std::fs::read_to_string(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    script
}
