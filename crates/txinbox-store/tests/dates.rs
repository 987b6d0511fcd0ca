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

/// A filter's time written with an offset can be past year 9999 in UTC: every rejection is before it, on
/// SQLite as on PostgreSQL.
fn end_of_time() -> chrono::DateTime<Utc> {
    chrono::DateTime::parse_from_rfc3339("9999-12-31T23:00:00-05:00")
        .unwrap()
        .with_timezone(&Utc)
}

#[tokio::test]
async fn a_rejection_filter_past_year_9999_in_utc_reads_the_same_on_sqlite() {
    use txinbox_store::ops::RejectionFilter;
    let store = txinbox_testkit::sqlite_store().await;
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', 's', 'm', 'payload_collision', 'h', 'h2', 'd', ?1)")
        .bind(now)
        .execute(store.pool())
        .await
        .unwrap();
    let f = RejectionFilter::new().consumer("c");
    let before = store
        .rejections(&f.clone().until(end_of_time()))
        .await
        .unwrap();
    let after = store.rejections(&f.since(end_of_time())).await.unwrap();
    assert_eq!(
        (before.len(), after.len()),
        (1, 0),
        "before and after {}",
        end_of_time()
    );
}

#[tokio::test]
async fn a_rejection_filter_past_year_9999_in_utc_reads_the_same_on_postgres() {
    use txinbox_store::ops::RejectionFilter;
    let store = txinbox_testkit::pg_store(2).await;
    sqlx::query("INSERT INTO txinbox_rejections (consumer_name, source, message_id, kind, payload_hash, conflicts_with, detail, recorded_at) VALUES ('c', 's', 'm', 'payload_collision', 'h', 'h2', 'd', now())")
        .execute(store.pool())
        .await
        .unwrap();
    let f = RejectionFilter::new().consumer("c");
    let before = store
        .rejections(&f.clone().until(end_of_time()))
        .await
        .unwrap();
    let after = store.rejections(&f.since(end_of_time())).await.unwrap();
    assert_eq!(
        (before.len(), after.len()),
        (1, 0),
        "before and after {}",
        end_of_time()
    );
}

/// A keep of "for ever" purges before the earliest date there is (`txinbox_core::time::before` saturates to
/// `DateTime::MIN_UTC`): nothing is purged, and the purge is no error, on PostgreSQL as on SQLite.
async fn purged_before_the_first_date<DB: txinbox_store::Backend>(store: Store<DB>) {
    use txinbox_core::effects::EffectStore;
    let first = chrono::DateTime::<Utc>::MIN_UTC;
    for table in [Table::Markers, Table::Rejections, Table::Effects] {
        let purged = store.purge_batch(table, first, 100).await;
        assert!(
            matches!(&purged, Ok(p) if p.is_empty()),
            "{table:?}: {purged:?}"
        );
    }
    let done = store.purge_done_effects(first, 100).await;
    assert!(matches!(done, Ok(0)), "{done:?}");
}

#[tokio::test]
async fn a_purge_before_the_first_date_purges_nothing_on_sqlite() {
    purged_before_the_first_date(txinbox_testkit::sqlite_store().await).await;
}

#[tokio::test]
async fn a_purge_before_the_first_date_purges_nothing_on_postgres() {
    purged_before_the_first_date(txinbox_testkit::pg_store(2).await).await;
}
