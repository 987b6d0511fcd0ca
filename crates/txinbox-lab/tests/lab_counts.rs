//! The lab's counts: refused with a typed error before any store is created, never a panic or a wrap.

use txinbox_lab::lab::{run_lab, run_lab_on, LabError, Target, MAX_DELIVERIES};
use txinbox_store::Store;

/// Counts the lab cannot run: no message, no copy, a product above the bound, a product that overflows.
fn refused() -> Vec<(usize, usize)> {
    vec![
        (0, 1),
        (1, 0),
        (0, 0),
        (MAX_DELIVERIES + 1, 1),
        (1, MAX_DELIVERIES + 1),
        (1001, 1000),
        (usize::MAX, 2),
        (usize::MAX, usize::MAX),
        (usize::MAX / 2 + 1, 2),
    ]
}

#[tokio::test]
async fn run_lab_on_refuses_bad_counts_before_creating_the_store() {
    // A directory that does not exist: creating the fresh database there fails, so any error but
    // `Deliveries` means the store was attempted before the counts were checked.
    let dir = std::env::temp_dir().join(format!("txinbox-lab-absent-{}", std::process::id()));
    assert!(!dir.exists());
    let target = Target::Sqlite(format!("sqlite:{}", dir.join("lab.db").display()));
    for (messages, copies) in refused() {
        match run_lab_on(&target, messages, copies).await {
            Err(LabError::Deliveries {
                messages: m,
                copies: c,
            }) => {
                assert_eq!((m, c), (messages, copies));
            }
            other => panic!("{messages} x {copies}: {other:?}"),
        }
    }
    assert!(!dir.exists());
}

#[tokio::test]
async fn run_lab_refuses_bad_counts_before_creating_the_tables() {
    // A closed pool: creating the tables fails, so only a check made before it gives `Deliveries`.
    let store = Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .unwrap();
    store.close().await;
    for (messages, copies) in refused() {
        match run_lab(store.clone(), messages, copies).await {
            Err(LabError::Deliveries { .. }) => {}
            other => panic!("{messages} x {copies}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn run_lab_on_runs_counts_within_the_bound() {
    let target = Target::Sqlite("sqlite::memory:".into());
    let r = run_lab_on(&target, 3, 2).await.unwrap();
    assert_eq!(r.deliveries, 6);
    assert_eq!(r.accepted, 3);
    assert_eq!(r.duplicates, 3);
    assert_eq!(r.business_effects, 3);
}

/// A batch window's batch outside 2 to MAX_BATCH_COMMIT is refused before any store is created: a window sends
/// twice its batch through the in-memory broker, so `usize::MAX` would allocate without end (or overflow).
#[tokio::test]
async fn batch_windows_refuse_a_batch_out_of_bounds_before_creating_the_store() {
    use txinbox_lab::windows::{run_on_batch, run_window_batch, Window};
    let max = txinbox_core::runtime::worker::MAX_BATCH_COMMIT;
    let dir = std::env::temp_dir().join(format!("txinbox-lab-absent-b-{}", std::process::id()));
    let target = Target::Sqlite(format!("sqlite:{}", dir.join("lab.db").display()));
    let store = Store::<sqlx::Sqlite>::connect("sqlite::memory:")
        .await
        .unwrap();
    store.close().await;
    for batch in [0, 1, max + 1, usize::MAX] {
        for w in Window::BATCH {
            match run_on_batch(&target, w, batch).await {
                Err(LabError::Usage(m)) => assert!(m.contains("must be 2 to"), "{m}"),
                other => panic!("{batch}: {other:?}"),
            }
            match run_window_batch(store.clone(), w, batch).await {
                Err(LabError::Usage(m)) => assert!(m.contains("must be 2 to"), "{m}"),
                other => panic!("{batch}: {other:?}"),
            }
        }
    }
    assert!(!dir.exists());
}
