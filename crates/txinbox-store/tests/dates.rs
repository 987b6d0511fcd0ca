//! Dates at the edges of what a store keeps: a marker kept "for ever" (a retention of `Duration::MAX`,
//! saturated by `txinbox_core::time::after`) is never purged, on SQLite, whose dates are text compared as
//! text, as on PostgreSQL.

use std::time::Duration;

use chrono::Utc;
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
use txinbox_core::{
    ConsumerName, IdentityPolicy, InboxStore, MarkerInsert, MarkerRow, ReceivedMessage,
};
use txinbox_store::Store;

async fn kept_for_ever<DB: txinbox_store::Backend>(store: Store<DB>) {
    let mut m = ReceivedMessage::new(b"{}".to_vec());
    let evt = format!("evt-{}", uuid::Uuid::new_v4().simple());
    m.attributes.insert("ce-id".into(), evt);
    m.attributes.insert("ce-source".into(), "crm".into());
    let id = IdentityPolicy::new(ConsumerName::new("c").unwrap())
        .resolve(&m)
        .unwrap();
    let now = Utc::now();
    let until = txinbox_core::time::after(now, Duration::MAX);
    let row = MarkerRow::new(&id, "h", now, now, until, 1);
    let tx = store.begin().await.unwrap();
    assert_eq!(
        store.insert_marker(&tx, &row).await.unwrap(),
        MarkerInsert::Inserted
    );
    store.commit(tx).await.unwrap();
    let purged = store
        .purge_batch(
            Table::Markers,
            now + chrono::Duration::days(365 * 1000),
            100,
        )
        .await
        .unwrap();
    assert!(purged.is_empty(), "{purged:?}");
}

#[tokio::test]
async fn a_marker_kept_for_ever_is_never_purged_on_sqlite() {
    kept_for_ever(txinbox_testkit::sqlite_store().await).await;
}

#[tokio::test]
async fn a_marker_kept_for_ever_is_never_purged_on_postgres() {
    kept_for_ever(txinbox_testkit::pg_store(2).await).await;
}
