//! Text a store is handed from outside (a destination's reference, an executor's error) holds whatever the
//! outside sent, a NUL character included: PostgreSQL's text refuses it where SQLite keeps it, so both
//! stores keep it as U+FFFD, and an effect a destination did is recorded done on either.

use chrono::Utc;
use txinbox_core::effects::{EffectStore, Transition};
use txinbox_store::Store;

async fn finished_with_a_nul<DB: txinbox_store::Backend>(store: Store<DB>, insert: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let now = Utc::now() + chrono::Duration::seconds(1);
    let destinations = vec!["d".to_owned()];
    let until = now + chrono::Duration::minutes(1);
    let claimed = store
        .claim_effects("runner", &destinations, now, until, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let id = claimed[0].id;
    let retry = Transition::Retry {
        next_at: now,
        error: "refused: \0 in the answer".into(),
        attempts: 1,
        reconciliations: 0,
        maybe_happened: false,
    };
    let done = store
        .finish_effect(id, "runner", &retry.columns(), now)
        .await;
    assert!(matches!(done, Ok(true)), "{done:?}");
    let claimed = store
        .claim_effects("runner", &destinations, now, until, 10)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let done = Transition::Done {
        reference: Some("task\0-1".into()),
        attempts: 2,
        reconciliations: 0,
    };
    let finished = store
        .finish_effect(id, "runner", &done.columns(), now)
        .await;
    assert!(matches!(finished, Ok(true)), "{finished:?}");
    let e = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(e.reference.as_deref(), Some("task\u{fffd}-1"));
}

const EFFECT: &str = "INSERT INTO txinbox_effects (consumer_name, message_id, idempotency_key, name, destination, payload, metadata, external_ref, state, next_attempt_at, created_at, updated_at) VALUES ('c', 'm', 'k', 'n', 'd', x'00', '{}', 'k', 'pending', NOW, NOW, NOW)";

#[tokio::test]
async fn a_nul_from_a_destination_is_kept_as_a_replacement_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    finished_with_a_nul(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn a_nul_from_a_destination_is_kept_as_a_replacement_on_postgres() {
    finished_with_a_nul(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}

/// A limit below one (the options' public fields take any number) claims one effect, on PostgreSQL as on
/// SQLite, where one refused the statement (a negative LIMIT) and the other claimed every due effect.
async fn claimed_with_a_negative_limit<DB: txinbox_store::Backend>(store: Store<DB>, insert: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    for key in ["k1", "k2"] {
        sqlx::query(&insert.replace("'k'", &format!("'{key}'")))
            .execute(store.pool())
            .await
            .unwrap();
    }
    let now = Utc::now() + chrono::Duration::seconds(1);
    let claimed = store
        .claim_effects(
            "runner",
            &["d".to_owned()],
            now,
            now + chrono::Duration::minutes(1),
            -1,
        )
        .await;
    assert!(matches!(&claimed, Ok(c) if c.len() == 1), "{claimed:?}");
}

#[tokio::test]
async fn a_negative_claim_limit_claims_one_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    claimed_with_a_negative_limit(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn a_negative_claim_limit_claims_one_on_postgres() {
    claimed_with_a_negative_limit(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}

/// An operator's query naming a consumer, a message or a kind with a NUL in it finds nothing, on PostgreSQL
/// as on SQLite: no stored name or id holds a NUL, and PostgreSQL refused the parameter itself.
macro_rules! queried_with_a_nul {
    ($store:expr) => {{
        use txinbox_store::ops::RejectionFilter;
        let store = $store;
        let now = Utc::now();
        let f = RejectionFilter::new().consumer("c\0").kind("payload_collision\0");
        let rejections = store.rejections(&f).await;
        assert!(matches!(&rejections, Ok(r) if r.is_empty()), "{rejections:?}");
        let stats = store.consumer_stats(Some("\0"), now).await;
        assert!(
            matches!(&stats, Ok(s) if s.len() == 1 && s[0].inbox_rows == 0),
            "{stats:?}"
        );
        let story = store.message_story("c", "m\0", Some("s\0")).await;
        assert!(matches!(&story, Ok(s) if !s.found()), "{story:?}");
    }};
}

#[tokio::test]
async fn an_operator_query_with_a_nul_finds_nothing_on_sqlite() {
    queried_with_a_nul!(txinbox_testkit::sqlite_store().await);
}

#[tokio::test]
async fn an_operator_query_with_a_nul_finds_nothing_on_postgres() {
    queried_with_a_nul!(txinbox_testkit::pg_store(2).await);
}

/// A runner's destination with a NUL in it is no effect's: it claims nothing and the others' effects are
/// claimed, on PostgreSQL as on SQLite, where PostgreSQL refused the whole claim.
async fn claimed_for_a_destination_with_a_nul<DB: txinbox_store::Backend>(
    store: Store<DB>,
    insert: &str,
) where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let now = Utc::now() + chrono::Duration::seconds(1);
    let claimed = store
        .claim_effects(
            "runner",
            &["d\0".to_owned(), "d".to_owned()],
            now,
            now + chrono::Duration::minutes(1),
            10,
        )
        .await;
    assert!(matches!(&claimed, Ok(c) if c.len() == 1), "{claimed:?}");
    let none = store
        .claim_effects(
            "runner",
            &["\0".to_owned()],
            now,
            now + chrono::Duration::minutes(1),
            10,
        )
        .await;
    assert!(matches!(&none, Ok(c) if c.is_empty()), "{none:?}");
}

#[tokio::test]
async fn a_destination_with_a_nul_claims_nothing_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    claimed_for_a_destination_with_a_nul(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn a_destination_with_a_nul_claims_nothing_on_postgres() {
    claimed_for_a_destination_with_a_nul(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}

/// An executor's request hash is its own text: one with a NUL is kept as U+FFFD and the effect recorded
/// done, on PostgreSQL as on SQLite, where PostgreSQL refused the finish on every try.
async fn finished_with_a_nul_in_its_hash<DB: txinbox_store::Backend>(store: Store<DB>, insert: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let now = Utc::now() + chrono::Duration::seconds(1);
    let claimed = store
        .claim_effects(
            "runner",
            &["d".to_owned()],
            now,
            now + chrono::Duration::minutes(1),
            10,
        )
        .await
        .unwrap();
    let done = Transition::Done {
        reference: None,
        attempts: 1,
        reconciliations: 0,
    };
    let cols = done.columns().sent_hash(Some("ab\0cd"));
    let finished = store
        .finish_effect(claimed[0].id, "runner", &cols, now)
        .await;
    assert!(matches!(finished, Ok(true)), "{finished:?}");
    let e = store.find_effect("k").await.unwrap().unwrap();
    assert_eq!(e.sent_hash.as_deref(), Some("ab\u{fffd}cd"));
}

#[tokio::test]
async fn a_request_hash_with_a_nul_is_kept_as_a_replacement_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    finished_with_a_nul_in_its_hash(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn a_request_hash_with_a_nul_is_kept_as_a_replacement_on_postgres() {
    finished_with_a_nul_in_its_hash(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}

/// A look-up by an effect's key or a consumer's name with a NUL in it finds nothing, on PostgreSQL as on
/// SQLite, where PostgreSQL refused the parameter.
async fn looked_up_with_a_nul<DB: txinbox_store::Backend>(store: Store<DB>) {
    use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
    let found = store.find_effect("k\0").await;
    assert!(matches!(found, Ok(None)), "{found:?}");
    let rows = store.inbox_rows("c\0").await;
    assert!(matches!(rows, Ok(0)), "{rows:?}");
    for table in Table::ALL {
        let stats = store.table_stats(table, "c\0").await;
        assert!(matches!(stats, Ok((0, None))), "{table:?}: {stats:?}");
    }
}

#[tokio::test]
async fn a_look_up_with_a_nul_finds_nothing_on_sqlite() {
    looked_up_with_a_nul(txinbox_testkit::sqlite_store().await).await;
}

#[tokio::test]
async fn a_look_up_with_a_nul_finds_nothing_on_postgres() {
    looked_up_with_a_nul(txinbox_testkit::pg_store(2).await).await;
}

/// A runner's name is its own text: one with a NUL claims and finishes its effects (kept with U+FFFD), on
/// PostgreSQL as on SQLite, where PostgreSQL refused every claim of that runner.
async fn held_by_a_name_with_a_nul<DB: txinbox_store::Backend>(store: Store<DB>, insert: &str)
where
    for<'c> &'c sqlx::Pool<DB>: sqlx::Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
{
    sqlx::query(insert).execute(store.pool()).await.unwrap();
    let now = Utc::now() + chrono::Duration::seconds(1);
    let claimed = store
        .claim_effects(
            "run\0ner",
            &["d".to_owned()],
            now,
            now + chrono::Duration::minutes(1),
            10,
        )
        .await;
    assert!(matches!(&claimed, Ok(c) if c.len() == 1), "{claimed:?}");
    let done = Transition::Done {
        reference: None,
        attempts: 1,
        reconciliations: 0,
    };
    let finished = store
        .finish_effect(claimed.unwrap()[0].id, "run\0ner", &done.columns(), now)
        .await;
    assert!(matches!(finished, Ok(true)), "{finished:?}");
}

#[tokio::test]
async fn a_runner_named_with_a_nul_claims_and_finishes_on_sqlite() {
    let now = Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true);
    held_by_a_name_with_a_nul(
        txinbox_testkit::sqlite_store().await,
        &EFFECT.replace("NOW", &format!("'{now}'")),
    )
    .await;
}

#[tokio::test]
async fn a_runner_named_with_a_nul_claims_and_finishes_on_postgres() {
    held_by_a_name_with_a_nul(
        txinbox_testkit::pg_store(2).await,
        &EFFECT
            .replace("x'00'", "'\\x00'::bytea")
            .replace("NOW", "now()"),
    )
    .await;
}
