//! The operator queries (`txinbox_dynamodb::ops`) against DynamoDB Local (started by `scripts/dynamodb.sh`,
//! `TXINBOX_DYNAMODB_ENDPOINT`), on a fresh table filled through the real inbox: applied messages, a
//! redelivered copy, a payload collision, a business duplicate, another consumer's message, a claimed effect,
//! a marker moved two hours back and an expired marker not yet deleted by the TTL. Every figure is exact.

use aws_sdk_dynamodb::types::AttributeValue;
use aws_sdk_dynamodb::Client;
use chrono::{DateTime, Duration, Utc};
use txinbox_core::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
use txinbox_core::effects::EffectStore;
use txinbox_core::{
    ConsumerName, Effect, Handled, HandlerError, IdentityPolicy, Inbox, Message, OutcomeKind,
    Worker,
};
use txinbox_dynamodb::layout;
use txinbox_dynamodb::ops::{RejectionFilter, RejectionId};
use txinbox_dynamodb::{DynamoError, DynamoOptions, DynamoStore, DynamoTx};

mod common;

const CONSUMER: &str = "crm-followup";
const SOURCE: &str = "crm";

fn client() -> Client {
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap_or_else(|_| {
        panic!("TXINBOX_DYNAMODB_ENDPOINT is not set: start DynamoDB Local with `eval \"$(bash scripts/dynamodb.sh start)\"` (scripts/test.sh does)")
    });
    txinbox_dynamodb::emulator_client(&endpoint)
}

#[derive(serde::Deserialize)]
struct Meeting {
    opportunity: String,
    meeting: String,
}

fn meeting(id: &str, opportunity: &str, meeting: &str) -> OutgoingMessage {
    OutgoingMessage::new(format!(
        r#"{{"opportunity":"{opportunity}","meeting":"{meeting}"}}"#
    ))
    .cloudevent(SOURCE, id, "meeting.ended")
    // One FIFO group: the copies are decided in the order sent.
    .group("opportunities")
}

/// Applies `msgs` for `consumer`: each applied message records one effect `create_task` to `crm`, with the
/// business key `followup:<opportunity>:<meeting>`.
async fn apply(
    store: &DynamoStore,
    consumer: &str,
    msgs: Vec<OutgoingMessage>,
) -> txinbox_core::WorkerReport {
    let queue = MemoryQueue::new(QueueOptions::default().max_receive_count(Some(3)));
    for m in msgs {
        queue.send(m);
    }
    let processor = Inbox::new(
        store.clone(),
        IdentityPolicy::new(ConsumerName::new(consumer).unwrap()),
    )
    .bind(|_tx: DynamoTx, msg: Message<Meeting>| async move {
        let task = format!("{}:{}", msg.body.opportunity, msg.body.meeting);
        Ok::<_, HandlerError>(Handled::reference(task.clone()).effect(Effect::new(
            "create_task",
            "crm",
            task.into_bytes(),
        )))
    })
    .business_key(|m: &Meeting| Some(format!("followup:{}:{}", m.opportunity, m.meeting)));
    Worker::new(queue.receiver(), processor)
        .run_until_idle()
        .await
}

async fn set_marker(
    c: &Client,
    table: &str,
    message_id: &str,
    expr: &str,
    values: &[(&str, AttributeValue)],
) {
    let mut req = c
        .update_item()
        .table_name(table)
        .key(
            "pk",
            AttributeValue::S(layout::marker_pk(CONSUMER, SOURCE, message_id)),
        )
        .update_expression(expr)
        .condition_expression("attribute_exists(pk)");
    for (k, v) in values {
        req = req.expression_attribute_values(*k, v.clone());
    }
    req.send().await.unwrap();
}

/// A client, and a store on a fresh table of its own.
async fn fresh_store() -> (Client, String, DynamoStore) {
    let c = client();
    let table = format!("txinbox-ops-{}", uuid::Uuid::new_v4().simple());
    DynamoStore::create_table(&c, &table).await.unwrap();
    let store = DynamoStore::open(c.clone(), &table, DynamoOptions::default())
        .await
        .unwrap();
    (c, table, store)
}

#[tokio::test]
async fn stats_story_and_rejections_give_exact_figures_through_keys_only() {
    let (c, table, store) = fresh_store().await;
    let started = Utc::now();

    let report = apply(
        &store,
        CONSUMER,
        vec![
            meeting("m-1", "o-1", "x"),
            meeting("m-2", "o-1", "y"),
            meeting("m-3", "o-2", "x"),
            // A redelivered copy: a duplicate, no evidence.
            meeting("m-1", "o-1", "x"),
            // Same id, another payload: a payload collision.
            meeting("m-1", "o-9", "z"),
            // Another id, the business key of m-2: a business duplicate.
            meeting("m-4", "o-1", "y"),
        ],
    )
    .await;
    assert_eq!(report.count(OutcomeKind::Applied), 3, "{report:?}");
    assert_eq!(report.count(OutcomeKind::Duplicate), 1, "{report:?}");
    assert_eq!(report.count(OutcomeKind::PayloadCollision), 1, "{report:?}");
    assert_eq!(
        report.count(OutcomeKind::BusinessDuplicate),
        1,
        "{report:?}"
    );
    // Another consumer: its marker, evidence and effect are not counted for this one.
    let other = apply(&store, "billing", vec![meeting("b-1", "o-1", "x")]).await;
    assert_eq!(other.count(OutcomeKind::Applied), 1, "{other:?}");
    // One effect of the consumer claimed: in flight.
    let now = Utc::now();
    let claimed = store
        .claim_effects(
            "ops-test",
            &["crm".to_owned()],
            now,
            now + Duration::minutes(5),
            1,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1);
    let claimed_id = claimed[0].id;
    // m-2 processed two hours ago (out of the last hour, the oldest); m-3 expired, not yet deleted.
    let two_hours_ago = Utc::now() - Duration::hours(2);
    let old = layout::ts(two_hours_ago);
    set_marker(
        &c,
        &table,
        "m-2",
        "SET processed_at = :t, gsi1sk = :sk",
        &[
            (":t", AttributeValue::S(old.clone())),
            (":sk", AttributeValue::S(format!("{old}#m-2"))),
        ],
    )
    .await;
    set_marker(
        &c,
        &table,
        "m-3",
        "SET expires_at = :e",
        &[(
            ":e",
            AttributeValue::N((Utc::now().timestamp() - 10).to_string()),
        )],
    )
    .await;

    // ---- stats
    let m1 = store
        .message_story(CONSUMER, "m-1", SOURCE, None)
        .await
        .unwrap();
    let m1_marker = m1.markers[0].clone();
    let now = Utc::now();
    let s = store.consumer_stats(CONSUMER, now).await.unwrap();
    assert_eq!(s.consumer, CONSUMER);
    assert_eq!(s.inbox_rows, 2, "m-1 and m-2; m-3 expired: {s:?}");
    assert_eq!(s.rows_last_hour, 1, "m-1 only: {s:?}");
    assert_eq!(s.oldest_processed_at, Some(parse(&old)));
    assert_eq!(s.newest_processed_at, Some(m1_marker.processed_at));
    assert_eq!(s.rejections.len(), 2);
    assert_eq!(s.rejections["payload_collision"], 1);
    assert_eq!(s.rejections["business_duplicate"], 1);
    let last = s.last_rejection_at.expect("a rejection time");
    assert!(last >= started && last <= now, "{last}");
    assert_eq!(s.effects.len(), 7, "every state: {:?}", s.effects);
    assert_eq!(s.effects["pending"], 2, "{:?}", s.effects);
    assert_eq!(s.effects["in_flight"], 1, "{:?}", s.effects);
    assert_eq!(s.effects.values().sum::<i64>(), 3, "{:?}", s.effects);
    let oldest = s.oldest_pending_effect_at.expect("effects wait");
    assert!(oldest >= started && oldest <= now, "{oldest}");
    assert_eq!(
        s.effect_lag_seconds,
        Some((now - oldest).num_milliseconds() as f64 / 1000.0)
    );
    assert_eq!(s.measured_at, now);
    let b = store.consumer_stats("billing", now).await.unwrap();
    assert_eq!((b.inbox_rows, b.rows_last_hour), (1, 1));
    assert_eq!(b.effects["pending"], 1);
    assert_eq!(b.rejections.values().sum::<i64>(), 0);
    assert_eq!(b.last_rejection_at, None);
    let none = store.consumer_stats("nobody", now).await.unwrap();
    assert_eq!(none.inbox_rows, 0);
    assert_eq!(none.oldest_processed_at, None);
    assert_eq!(none.effect_lag_seconds, None);

    // ---- show: a collided message, its marker, its evidence and its effect.
    assert_eq!(m1.markers.len(), 1);
    assert_eq!(m1.source.as_deref(), Some(SOURCE));
    assert_eq!(m1_marker.consumer, CONSUMER);
    assert_eq!(m1_marker.source, SOURCE);
    assert_eq!(m1_marker.message_id, "m-1");
    assert_eq!(m1_marker.business_key.as_deref(), Some("followup:o-1:x"));
    assert_eq!(m1_marker.result_reference.as_deref(), Some("o-1:x"));
    assert_eq!(m1_marker.event_type.as_deref(), Some("meeting.ended"));
    assert_eq!(m1_marker.delivery_count, 1);
    assert!(m1_marker.retention_until > m1_marker.processed_at);
    assert_eq!(m1.rejections.len(), 1, "{m1:?}");
    let r = &m1.rejections[0];
    assert_eq!(r.kind, "payload_collision");
    assert_eq!(r.conflicts_with, m1_marker.payload_hash);
    assert_ne!(r.payload_hash, m1_marker.payload_hash);
    assert!(
        matches!(&r.id, RejectionId::Uuid(u) if u.len() == 36),
        "a UUID: {}",
        r.id
    );
    assert_eq!(m1.effects.len(), 1, "{m1:?}");
    let fx = &m1.effects[0];
    assert_eq!(
        (fx.name.as_str(), fx.destination.as_str()),
        ("create_task", "crm")
    );
    assert_eq!(fx.id, layout::effect_id(&fx.key));
    assert_eq!(fx.external_ref, fx.key);
    assert!(
        (fx.state == "pending" && fx.id != claimed_id)
            || (fx.state == "in_flight"
                && fx.id == claimed_id
                && fx.claimed_by.as_deref() == Some("ops-test")),
        "{fx:?}"
    );
    // By effect name: one GetItem, the same effect; an unknown name finds none.
    let named = store
        .message_story(CONSUMER, "m-1", SOURCE, Some(&["create_task".to_owned()]))
        .await
        .unwrap();
    assert_eq!(named.effects, m1.effects);
    let unnamed = store
        .message_story(CONSUMER, "m-1", SOURCE, Some(&["nope".to_owned()]))
        .await
        .unwrap();
    assert!(unnamed.effects.is_empty());
    // A business duplicate: no marker, the evidence names the holder.
    let m4 = store
        .message_story(CONSUMER, "m-4", SOURCE, None)
        .await
        .unwrap();
    assert!(m4.found());
    assert_eq!(m4.markers.len(), 0);
    assert_eq!(m4.rejections.len(), 1);
    assert_eq!(m4.rejections[0].kind, "business_duplicate");
    assert_eq!(m4.rejections[0].conflicts_with, "m-2");
    assert_eq!(
        m4.rejections[0].business_key.as_deref(),
        Some("followup:o-1:y")
    );
    assert_eq!(m4.effects.len(), 0);
    // An expired marker is absent; its effect is still there.
    let m3 = store
        .message_story(CONSUMER, "m-3", SOURCE, None)
        .await
        .unwrap();
    assert_eq!(
        (m3.markers.len(), m3.rejections.len(), m3.effects.len()),
        (0, 0, 1)
    );
    // Another source, another consumer, an unknown message: nothing.
    for (consumer, id, source) in [
        (CONSUMER, "m-1", "other"),
        ("billing", "m-1", SOURCE),
        (CONSUMER, "m-nope", SOURCE),
    ] {
        let s = store
            .message_story(consumer, id, source, Some(&["create_task".to_owned()]))
            .await
            .unwrap();
        assert!(!s.found(), "{s:?}");
    }

    // ---- rejections: newest first, by kind, by time, limited; never of every consumer (no key has them).
    let every = store.rejections(&RejectionFilter::new()).await.unwrap_err();
    assert!(matches!(every, DynamoError::NeedsKey(_)), "{every}");
    let all = store
        .rejections(&RejectionFilter::new().consumer(CONSUMER))
        .await
        .unwrap();
    let kinds: Vec<&str> = all.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["business_duplicate", "payload_collision"]);
    assert!(all[0].recorded_at >= all[1].recorded_at);
    assert_eq!(all[0].message_id, "m-4");
    assert_eq!(all[1].message_id, "m-1");
    assert_eq!(all[1], m1.rejections[0]);
    let collisions = store
        .rejections(
            &RejectionFilter::new()
                .consumer(CONSUMER)
                .kind("payload_collision"),
        )
        .await
        .unwrap();
    assert_eq!(collisions, vec![all[1].clone()]);
    let one = store
        .rejections(&RejectionFilter::new().consumer(CONSUMER).limit(1))
        .await
        .unwrap();
    assert_eq!(one, vec![all[0].clone()]);
    // Limit 1 of a kind that is not the newest: a second page is read.
    let one_collision = store
        .rejections(
            &RejectionFilter::new()
                .consumer(CONSUMER)
                .kind("payload_collision")
                .limit(1),
        )
        .await
        .unwrap();
    assert_eq!(one_collision, vec![all[1].clone()]);
    let later = Utc::now() + Duration::minutes(1);
    let between = store
        .rejections(
            &RejectionFilter::new()
                .consumer(CONSUMER)
                .since(started)
                .until(later),
        )
        .await
        .unwrap();
    assert_eq!(between, all);
    // `since` is inclusive, `until` exclusive, at the microsecond.
    let t0 = all[0].recorded_at;
    let at = |since: Option<DateTime<Utc>>, until: Option<DateTime<Utc>>| {
        let mut f = RejectionFilter::new().consumer(CONSUMER);
        if let Some(t) = since {
            f = f.since(t);
        }
        if let Some(t) = until {
            f = f.until(t);
        }
        let store = store.clone();
        async move { store.rejections(&f).await.unwrap().len() }
    };
    assert_eq!(at(Some(t0), None).await, 1);
    assert_eq!(at(None, Some(t0)).await, 1);
    assert_eq!(at(Some(t0), Some(t0)).await, 0);
    assert_eq!(at(Some(later), None).await, 0);
    assert_eq!(at(None, Some(started)).await, 0);
    assert!(store
        .rejections(&RejectionFilter::new().consumer("billing"))
        .await
        .unwrap()
        .is_empty());
}

fn parse(t: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(t).unwrap().with_timezone(&Utc)
}

/// A consumer's markers are spread over `layout::MARKER_SHARDS` partitions of `by_consumer` (DynamoDB limits
/// each partition of an index to 1,000 write units a second, and a throttled index throttles the table's
/// writes): each marker's index entry is in the partition its key names, and the counts read every one.
#[tokio::test]
async fn markers_spread_over_their_index_partitions_and_every_one_is_counted() {
    use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
    let (c, table, store) = fresh_store().await;
    const N: usize = 48;
    let msgs = (0..N)
        .map(|i| meeting(&format!("s-{i}"), &format!("o-{i}"), "x"))
        .collect();
    let report = apply(&store, CONSUMER, msgs).await;
    assert_eq!(report.count(OutcomeKind::Applied), N as u64, "{report:?}");

    // What the layout says each partition holds, against what the index holds.
    let mut expected = vec![0usize; layout::MARKER_SHARDS as usize];
    for i in 0..N {
        let pk = layout::marker_pk(CONSUMER, SOURCE, &format!("s-{i}"));
        expected[layout::marker_shard(&pk) as usize] += 1;
    }
    let mut found = Vec::new();
    for partition in layout::marker_partitions(CONSUMER) {
        let out = c
            .query()
            .table_name(&table)
            .index_name(layout::BY_CONSUMER)
            .key_condition_expression("gsi1pk = :p")
            .expression_attribute_values(":p", AttributeValue::S(partition))
            .select(aws_sdk_dynamodb::types::Select::Count)
            .send()
            .await
            .unwrap();
        assert!(out.last_evaluated_key().is_none(), "one page holds them");
        found.push(out.count() as usize);
    }
    assert_eq!(found, expected);
    let used = expected.iter().filter(|&&n| n > 0).count();
    assert!(used > layout::MARKER_SHARDS as usize / 2, "{expected:?}");

    let s = store.consumer_stats(CONSUMER, Utc::now()).await.unwrap();
    assert_eq!((s.inbox_rows, s.rows_last_hour), (N as i64, N as i64));
    let (markers, oldest) = store.table_stats(Table::Markers, CONSUMER).await.unwrap();
    assert_eq!(markers, N as i64);
    assert_eq!(oldest, s.oldest_processed_at);
}

/// A store on `table` whose every `Query` asks DynamoDB for one item a page (`Limit` 1, the request rewritten
/// on its way out): an item a filter leaves out is then a page of none with a `LastEvaluatedKey`, as the 1 MB
/// page of the service gives when its items do not match (AWS, Query: "If DynamoDB processes the number of
/// items up to the limit while processing the results, it stops the operation and returns the matching
/// values up to that point, and a key in LastEvaluatedKey to apply in a subsequent operation").
async fn one_item_a_page(table: &str) -> DynamoStore {
    use txinbox_testkit::sdk_http::{with_hook, HttpConnector};
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap();
    let http = with_hook(txinbox_dynamodb::http_client(), |mut request, connector| {
        let query = common::calls(&request, "Query");
        if query {
            let mut body: serde_json::Value =
                serde_json::from_slice(request.body().bytes().unwrap()).unwrap();
            body["Limit"] = serde_json::json!(1);
            let body = body.to_string();
            request
                .headers_mut()
                .insert("content-length", body.len().to_string());
            *request.body_mut() = body.into();
        }
        connector.call(request)
    });
    DynamoStore::open(
        common::hooked_client(&endpoint, http),
        table,
        DynamoOptions::default(),
    )
    .await
    .unwrap()
}

/// A message's story reads the base table strongly consistently: its marker's and its effects' `GetItem`s set
/// `ConsistentRead`, so a message applied a moment ago is found (AWS, DynamoDB read consistency: with
/// eventually consistent reads "the responses may not reflect the results of a recently completed write
/// operation"; "If you set ConsistentRead to true, DynamoDB returns a response with the most up-to-date data").
/// DynamoDB Local is always consistent, so the requests themselves are looked at, on their way out.
#[tokio::test]
async fn a_message_s_story_reads_its_marker_and_effects_consistently() {
    use std::sync::{Arc, Mutex};
    use txinbox_testkit::sdk_http::{with_hook, HttpConnector};
    let (_, table, store) = fresh_store().await;
    let report = apply(&store, CONSUMER, vec![meeting("m-1", "o-1", "x")]).await;
    assert_eq!(report.count(OutcomeKind::Applied), 1, "{report:?}");
    let gets: Arc<Mutex<Vec<serde_json::Value>>> = Arc::default();
    let seen = gets.clone();
    let http = with_hook(
        txinbox_dynamodb::http_client(),
        move |request, connector| {
            let get = common::calls(&request, "GetItem");
            if get {
                let body: serde_json::Value =
                    serde_json::from_slice(request.body().bytes().unwrap()).unwrap();
                seen.lock().unwrap().push(body);
            }
            connector.call(request)
        },
    );
    let endpoint = std::env::var("TXINBOX_DYNAMODB_ENDPOINT").unwrap();
    let watched = DynamoStore::open(
        common::hooked_client(&endpoint, http),
        &table,
        DynamoOptions::default(),
    )
    .await
    .unwrap();
    gets.lock().unwrap().clear();
    let story = watched
        .message_story(CONSUMER, "m-1", SOURCE, Some(&["create_task".to_owned()]))
        .await
        .unwrap();
    assert_eq!(
        (story.markers.len(), story.effects.len()),
        (1, 1),
        "{story:?}"
    );
    let gets = gets.lock().unwrap();
    assert_eq!(gets.len(), 2, "the marker's and the effect's: {gets:?}");
    for body in gets.iter() {
        assert_eq!(body["ConsistentRead"], serde_json::json!(true), "{body}");
    }
}

/// Every operator query and the effects' claim read a partition to its end, past the pages a filter leaves
/// empty: the figures, a message's story, the rejections, the effect counts, the table figures and a claim
/// are the same read one item a page as read whole, on a table where expired markers, another consumer's
/// effects and evidence of two kinds sit between the items each query keeps.
#[tokio::test]
async fn every_query_reads_on_past_the_pages_a_filter_leaves_empty() {
    use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};
    let (c, table, store) = fresh_store().await;
    let ids = ["m-1", "m-2", "m-3", "m-4", "m-5", "m-6", "m-7", "m-8"];
    let mut msgs: Vec<OutgoingMessage> = ids
        .iter()
        .enumerate()
        .map(|(i, id)| meeting(id, &format!("o-{i}"), "x"))
        .collect();
    // A payload collision and a business duplicate: evidence of two kinds.
    msgs.push(meeting("m-1", "o-9", "z"));
    msgs.push(meeting("m-9", "o-1", "x"));
    let report = apply(&store, CONSUMER, msgs).await;
    assert_eq!(report.count(OutcomeKind::Applied), 8, "{report:?}");
    let other = apply(&store, "billing", vec![meeting("b-1", "o-1", "x")]).await;
    assert_eq!(other.count(OutcomeKind::Applied), 1, "{other:?}");
    // Six of the eight markers expired, not yet deleted by the TTL.
    for id in &ids[2..] {
        set_marker(
            &c,
            &table,
            id,
            "SET expires_at = :e",
            &[(
                ":e",
                AttributeValue::N((Utc::now().timestamp() - 10).to_string()),
            )],
        )
        .await;
    }
    let paged = one_item_a_page(&table).await;
    let now = Utc::now();
    let whole = store.consumer_stats(CONSUMER, now).await.unwrap();
    assert_eq!(whole.inbox_rows, 2);
    assert_eq!(paged.consumer_stats(CONSUMER, now).await.unwrap(), whole);
    for id in ["m-1", "m-8"] {
        assert_eq!(
            paged
                .message_story(CONSUMER, id, SOURCE, None)
                .await
                .unwrap(),
            store
                .message_story(CONSUMER, id, SOURCE, None)
                .await
                .unwrap()
        );
    }
    assert_eq!(
        store
            .message_story(CONSUMER, "m-8", SOURCE, None)
            .await
            .unwrap()
            .effects
            .len(),
        1
    );
    for filter in [
        RejectionFilter::new().consumer(CONSUMER),
        RejectionFilter::new()
            .consumer(CONSUMER)
            .kind("payload_collision")
            .limit(1),
    ] {
        let whole = store.rejections(&filter).await.unwrap();
        assert_eq!(whole.len(), filter.limit.min(2) as usize);
        assert_eq!(paged.rejections(&filter).await.unwrap(), whole);
    }
    assert_eq!(
        paged.effect_counts().await.unwrap(),
        store.effect_counts().await.unwrap()
    );
    for t in [Table::Markers, Table::Rejections, Table::Effects] {
        assert_eq!(
            paged.table_stats(t, CONSUMER).await.unwrap(),
            store.table_stats(t, CONSUMER).await.unwrap()
        );
    }
    // The claim: every effect due to `crm` (eight of this consumer, one of billing's), one a page.
    let claimed = paged
        .claim_effects(
            "r",
            &["crm".to_owned()],
            now + Duration::minutes(1),
            now + Duration::minutes(5),
            100,
        )
        .await
        .unwrap();
    assert_eq!(claimed.len(), 9);
}
