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

const EFFECT: &str = "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'n', 'd', x'00', '{}', 'k', 'pending', NOW, NOW, NOW)";

/// Dates before year 1 in what a runner writes (a claim held until then, a retry due then, a compensation
/// at that time) are kept as year 1, on PostgreSQL as on SQLite, where PostgreSQL refused one before 4713
/// BC ("timestamp out of range"); and a date before 2000 is kept to the microsecond rounded down on both,
/// where PostgreSQL rounded it towards 2000: a purge just after a finish does not purge it on one and not
/// the other.
async fn runner_dates_before_year_1<DB: txinbox_store::Backend>(store: Store<DB>, insert: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    use txinbox_core::effects::{EffectStore, Transition};
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let first = chrono::DateTime::<Utc>::MIN_UTC;
    let now = Utc::now() + chrono::Duration::seconds(1);
    let d = vec!["d".to_owned()];
    let claimed = store.claim_effects("runner", &d, now, first, 10).await;
    assert!(matches!(&claimed, Ok(c) if c.len() == 1), "{claimed:?}");
    let id = claimed.unwrap()[0].id;
    // Its claim ended before it began: another runner takes it over.
    let again = store.claim_effects("other", &d, now, first, 10).await;
    assert!(matches!(&again, Ok(c) if c.len() == 1), "{again:?}");
    let retry = Transition::Retry {
        next_at: first,
        error: "e".into(),
        attempts: 1,
        reconciliations: 0,
        maybe_happened: false,
    };
    let r = store
        .finish_effect(id, "other", &retry.columns(), first)
        .await;
    assert!(matches!(r, Ok(true)), "{r:?}");
    let until = now + chrono::Duration::minutes(1);
    let claimed = store.claim_effects("runner", &d, now, until, 10).await;
    assert!(matches!(&claimed, Ok(c) if c.len() == 1), "{claimed:?}");
    let done = Transition::Done {
        reference: None,
        attempts: 2,
        reconciliations: 0,
    };
    let finished_at = chrono::DateTime::parse_from_rfc3339("1999-12-31T23:59:59.999999Z")
        .unwrap()
        .with_timezone(&Utc);
    let r = store
        .finish_effect(id, "runner", &done.columns(), finished_at)
        .await;
    assert!(matches!(r, Ok(true)), "{r:?}");
    let purged = store
        .purge_done_effects(finished_at + chrono::Duration::nanoseconds(500), 10)
        .await;
    assert!(matches!(purged, Ok(0)), "{purged:?}");
    let r = store.mark_compensated(id, "undone", first).await;
    assert!(matches!(r, Ok(true)), "{r:?}");
}

#[tokio::test]
async fn runner_dates_before_year_1_are_kept_alike_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    runner_dates_before_year_1(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn runner_dates_before_year_1_are_kept_alike_on_postgres() {
    runner_dates_before_year_1(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}

/// An operator's figures measured at the earliest date there is (the last hour before it is before every
/// date): no panic, every row counted and none in the last hour, on SQLite as on PostgreSQL.
macro_rules! stats_at_the_first_date {
    ($store:expr) => {{
        let store = $store;
        let first = chrono::DateTime::<Utc>::MIN_UTC;
        for consumer in [None, Some("c")] {
            let stats = store.consumer_stats(consumer, first).await;
            assert!(
                matches!(&stats, Ok(s) if s.iter().all(|s| s.rows_last_hour == 0)),
                "{stats:?}"
            );
        }
    }};
}

#[tokio::test]
async fn stats_at_the_first_date_do_not_panic_on_sqlite() {
    stats_at_the_first_date!(txinbox_testkit::sqlite_store().await);
}

#[tokio::test]
async fn stats_at_the_first_date_do_not_panic_on_postgres() {
    stats_at_the_first_date!(txinbox_testkit::pg_store(2).await);
}
