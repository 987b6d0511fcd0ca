//! The public-API shapes over HTTP: Stripe-like list, HubSpot-like search, the idempotency draft's
//! 409/422, key modes, no idempotency, the upsert and the search lag.

mod common;

use std::time::Duration;

use common::{answer, get, list_by_ref, post_legacy, post_v1, search_by_ref, upsert};
use reqwest::StatusCode;
use serde_json::{json, Value};
use txinbox_crm_api::{CrmApi, KeyMode};

async fn start(builder: txinbox_crm_api::CrmApiBuilder) -> CrmApi {
    builder.start().await.expect("the CRM API starts")
}

#[tokio::test]
async fn the_list_shape_answers_200_and_an_empty_list_when_nothing_matches() {
    let api = start(CrmApi::builder()).await;
    let http = reqwest::Client::new();
    let empty = list_by_ref(&http, &api, "missing").await;
    assert_eq!(empty.status, StatusCode::OK);
    assert_eq!(
        empty.json,
        json!({"object": "list", "data": [], "has_more": false})
    );

    let body = json!({"external_ref": "order-1", "title": "call"});
    let created = post_v1(&http, &api, Some("k-1"), &body).await.unwrap();
    assert_eq!(created.status, StatusCode::CREATED);
    let task = json!({"id": "task-1", "object": "task", "external_ref": "order-1",
        "idempotency_key": "k-1", "body": body});
    assert_eq!(created.json, task);
    let found = list_by_ref(&http, &api, "order-1").await;
    assert_eq!(
        found.json,
        json!({"object": "list", "data": [task], "has_more": false})
    );
    let by_id = get(&http, format!("{}/v1/tasks/task-1", api.url())).await;
    assert_eq!((by_id.status, by_id.json), (StatusCode::OK, task));
    let missing = get(&http, format!("{}/v1/tasks/task-9", api.url())).await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
    assert_eq!(missing.json, json!({"error": "not found"}));

    // One store: a legacy task shows in the /v1 list and the /v1 task in the legacy lookups.
    post_legacy(&http, &api, None, &json!({"external_ref": "order-2"}))
        .await
        .unwrap();
    let all = get(&http, format!("{}/v1/tasks", api.url())).await;
    assert_eq!(all.json["data"].as_array().map(Vec::len), Some(2));
    let legacy = get(&http, format!("{}/tasks?idempotency_key=k-1", api.url())).await;
    assert_eq!(legacy.status, StatusCode::OK);
    assert_eq!(legacy.json["id"], "task-1");

    for bad in ["externalRef=x", "external_ref=a&external_ref=b"] {
        let refused = get(&http, format!("{}/v1/tasks?{bad}", api.url())).await;
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
        assert!(refused.json["error"].is_string());
    }
}

#[tokio::test]
async fn the_hubspot_search_answers_total_0_when_nothing_matches() {
    let api = start(CrmApi::builder()).await;
    let http = reqwest::Client::new();
    let none = search_by_ref(&http, &api, "deal-1").await;
    assert_eq!(none.status, StatusCode::OK);
    assert_eq!(none.json, json!({"total": 0, "results": []}));

    let body = json!({"external_ref": "deal-1"});
    post_v1(&http, &api, Some("k"), &body).await.unwrap();
    post_v1(&http, &api, None, &json!({"external_ref": "deal-2"}))
        .await
        .unwrap();
    let one = search_by_ref(&http, &api, "deal-1").await;
    assert_eq!(
        one.json,
        json!({"total": 1, "results": [{"id": "task-1",
            "properties": {"external_ref": "deal-1", "idempotency_key": "k"}, "body": body}]})
    );
    // Groups are ORed, filters ANDed; idempotency_key is searchable too.
    let search = json!({"filterGroups": [
        {"filters": [{"propertyName": "idempotency_key", "operator": "EQ", "value": "k"},
                     {"propertyName": "external_ref", "operator": "EQ", "value": "deal-1"}]},
        {"filters": [{"propertyName": "external_ref", "operator": "EQ", "value": "deal-2"}]}
    ]});
    let url = format!("{}/v1/tasks/search", api.url());
    let both = answer(http.post(&url).json(&search)).await.unwrap();
    assert_eq!(both.json["total"], 2);
    for bad in [
        json!({}),
        json!({"filterGroups": [{"filters": [{"propertyName": "x", "operator": "EQ", "value": "1"}]}]}),
        json!({"filterGroups": [{"filters": [{"propertyName": "external_ref", "operator": "NEQ", "value": "1"}]}]}),
    ] {
        let refused = answer(http.post(&url).json(&bad)).await.unwrap();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let wrong_method = get(&http, url).await;
    assert_eq!(wrong_method.status, StatusCode::METHOD_NOT_ALLOWED);
}

#[tokio::test]
async fn a_key_in_progress_answers_409_and_the_task_then_exists_once() {
    // The second request must arrive while the first is still processed: 3 s from its arrival leaves room on
    // a loaded machine.
    let api = start(CrmApi::builder().processing(Duration::from_secs(3))).await;
    let http = reqwest::Client::new();
    let body = json!({"external_ref": "order-5"});
    let first = {
        let (http, api, body) = (http.clone(), api.clone(), body.clone());
        tokio::spawn(async move { post_v1(&http, &api, Some("k-5"), &body).await })
    };
    // Once the server has the first (its key reserved with the count, under one lock), not after a guess.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.attempts() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first create never arrived"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let conflict = post_v1(&http, &api, Some("k-5"), &body).await.unwrap();
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(
        conflict.json,
        json!({"error": "idempotency key in use: a request with this key is still being processed"})
    );
    // Not there yet for searches nor lookups.
    assert_eq!(search_by_ref(&http, &api, "order-5").await.json["total"], 0);
    let lookup = get(&http, format!("{}/tasks?idempotency_key=k-5", api.url())).await;
    assert_eq!(lookup.status, StatusCode::NOT_FOUND);
    assert_eq!(api.creates(), 0);

    let first = first.await.expect("task").expect("an answer");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(api.creates_for_key("k-5"), 1);
    let replay = post_v1(&http, &api, Some("k-5"), &body).await.unwrap();
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    assert_eq!(replay.bytes, first.bytes);
    assert_eq!((api.creates(), api.attempts()), (1, 3));
}

/// A held create keeps its key in progress until the caller releases it, whatever the time: no processing
/// time to outlast. A create answered at once (the 409) is not held, and the hold is used up.
#[tokio::test]
async fn a_held_create_keeps_its_key_in_progress_until_released() {
    let api = start(CrmApi::builder()).await;
    api.hold_next(1);
    let http = reqwest::Client::new();
    let body = json!({"external_ref": "order-7"});
    let first = {
        let (http, api, body) = (http.clone(), api.clone(), body.clone());
        tokio::spawn(async move { post_v1(&http, &api, Some("k-7"), &body).await })
    };
    while api.held() == 0 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let conflict = post_v1(&http, &api, Some("k-7"), &body).await.unwrap();
    assert_eq!(conflict.status, StatusCode::CONFLICT);
    assert_eq!(api.held(), 1, "the 409 is not held");
    assert_eq!(search_by_ref(&http, &api, "order-7").await.json["total"], 0);
    assert_eq!(api.creates(), 0);
    api.release_held();
    let first = first.await.expect("task").expect("an answer");
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!((api.creates_for_key("k-7"), api.held()), (1, 0));
    // The hold was used up: the next create answers at once.
    let other = post_v1(&http, &api, Some("k-8"), &body).await.unwrap();
    assert_eq!(other.status, StatusCode::CREATED);
    assert_eq!((api.creates(), api.attempts()), (2, 3));
}

#[tokio::test]
async fn a_client_that_times_out_mid_processing_still_gets_its_task() {
    // The retry must reach the API while the first request is still being processed: 3 s of processing
    // leaves room for a loaded machine.
    let api = start(CrmApi::builder().processing(Duration::from_secs(3))).await;
    let impatient = reqwest::Client::builder()
        .timeout(Duration::from_millis(100))
        .build()
        .expect("a client");
    let body = json!({"external_ref": "order-6"});
    let timed_out = post_v1(&impatient, &api, Some("k-6"), &body).await;
    assert!(
        timed_out.as_ref().is_err_and(reqwest::Error::is_timeout),
        "{timed_out:?}"
    );
    assert_eq!(api.creates(), 0, "still processing");
    let http = reqwest::Client::new();
    let retry = post_v1(&http, &api, Some("k-6"), &body).await.unwrap();
    assert_eq!(retry.status, StatusCode::CONFLICT);

    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while api.creates_for_key("k-6") == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never created");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let replay = post_v1(&http, &api, Some("k-6"), &body).await.unwrap();
    assert_eq!(replay.status, StatusCode::OK);
    assert!(replay.replayed());
    assert_eq!(replay.json["id"], "task-1");
    assert_eq!(api.creates(), 1);
}

#[tokio::test]
async fn a_key_reused_with_another_body_or_endpoint_answers_422() {
    let api = start(CrmApi::builder()).await;
    let http = reqwest::Client::new();
    let created = post_v1(&http, &api, Some("k"), &json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(created.status, StatusCode::CREATED);
    // Same JSON value, other key order and spacing: a replay.
    let same = answer(
        http.post(format!("{}/v1/tasks", api.url()))
            .header("Idempotency-Key", "k")
            .body(r#"{ "n" : 1 }"#),
    )
    .await
    .unwrap();
    assert_eq!(same.status, StatusCode::OK);
    let other = post_v1(&http, &api, Some("k"), &json!({"n": 2}))
        .await
        .unwrap();
    assert_eq!(other.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        other.json,
        json!({"error": "idempotency key reused with another body"})
    );
    let elsewhere = post_legacy(&http, &api, Some("k"), &json!({"n": 1}))
        .await
        .unwrap();
    assert_eq!(elsewhere.status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(
        (api.creates(), api.tasks()[0].body.clone()),
        (1, json!({"n": 1}))
    );
}

#[tokio::test]
async fn the_key_can_come_from_another_header_or_a_body_field() {
    let api = start(CrmApi::builder().key_mode(KeyMode::Header("PayPal-Request-Id".into()))).await;
    assert_eq!(api.key_mode(), KeyMode::Header("PayPal-Request-Id".into()));
    let http = reqwest::Client::new();
    let url = format!("{}/v1/tasks", api.url());
    let body = json!({"external_ref": "p"});
    let mut statuses = Vec::new();
    for header in ["paypal-request-id", "PAYPAL-REQUEST-ID"] {
        let request = http.post(&url).header(header, "pp-1").json(&body);
        statuses.push(answer(request).await.unwrap().status);
    }
    assert_eq!(statuses, [StatusCode::CREATED, StatusCode::OK]);
    // Idempotency-Key means nothing here: two creates.
    for _ in 0..2 {
        post_v1(&http, &api, Some("ignored"), &body).await.unwrap();
    }
    assert_eq!(api.creates_for_key("pp-1"), 1);
    assert_eq!(api.creates_for_ref("p"), 3);

    let api = start(CrmApi::builder().key_mode(KeyMode::BodyField("idempotency_key".into()))).await;
    let body = json!({"idempotency_key": "sq-1", "external_ref": "s"});
    let first = post_v1(&http, &api, None, &body).await.unwrap();
    let again = post_v1(&http, &api, None, &body).await.unwrap();
    let legacy = post_legacy(&http, &api, None, &json!({"idempotency_key": "sq-2"}))
        .await
        .unwrap();
    assert_eq!(
        (first.status, again.status, legacy.status),
        (StatusCode::CREATED, StatusCode::OK, StatusCode::CREATED)
    );
    assert_eq!(first.json["idempotency_key"], "sq-1");
    assert_eq!(legacy.json["idempotency_key"], "sq-2");
    for _ in 0..2 {
        post_v1(&http, &api, None, &json!({"external_ref": "no-key"}))
            .await
            .unwrap();
    }
    assert_eq!(
        (api.creates_for_key("sq-1"), api.creates_for_ref("no-key")),
        (1, 2)
    );
    let bad = post_v1(&http, &api, None, &json!({"idempotency_key": 5}))
        .await
        .unwrap();
    assert_eq!(bad.status, StatusCode::BAD_REQUEST);

    let refused = CrmApi::builder()
        .key_mode(KeyMode::Header("bad header".into()))
        .start()
        .await;
    assert!(
        matches!(refused, Err(txinbox_crm_api::Error::InvalidKeyMode(_))),
        "{refused:?}"
    );
}

#[tokio::test]
async fn without_idempotency_a_repeated_create_creates_twice() {
    let api = start(CrmApi::builder().key_mode(KeyMode::None)).await;
    assert!(!api.idempotency());
    let http = reqwest::Client::new();
    let body = json!({"external_ref": "twice"});
    for _ in 0..2 {
        let created = post_v1(&http, &api, Some("k"), &body).await.unwrap();
        assert_eq!(created.status, StatusCode::CREATED);
        assert_eq!(created.json["idempotency_key"], Value::Null);
    }
    assert_eq!(api.creates_for_ref("twice"), 2);
    assert_eq!(api.creates_for_key("k"), 0);
    assert_eq!(
        list_by_ref(&http, &api, "twice").await.json["data"]
            .as_array()
            .map(Vec::len),
        Some(2)
    );
}

#[tokio::test]
async fn the_upsert_never_makes_two_tasks_for_one_reference() {
    let api = start(CrmApi::builder().processing(Duration::from_millis(100))).await;
    let http = reqwest::Client::new();
    let first = upsert(&http, &api, "acct 1", &json!({"v": 1}))
        .await
        .unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert_eq!(first.json, json!({"id": "task-1", "created": true}));
    let second = upsert(&http, &api, "acct 1", &json!({"v": 2}))
        .await
        .unwrap();
    assert_eq!(second.status, StatusCode::OK);
    assert_eq!(second.json, json!({"id": "task-1", "created": false}));
    let task = get(&http, format!("{}/v1/tasks/task-1", api.url())).await;
    assert_eq!(task.json["body"], json!({"v": 2}));
    assert_eq!(task.json["external_ref"], "acct 1");

    let mut set = tokio::task::JoinSet::new();
    for v in 0..10 {
        let (http, api) = (http.clone(), api.clone());
        set.spawn(async move { upsert(&http, &api, "acct-2", &json!({"v": v})).await });
    }
    let mut created = 0;
    while let Some(result) = set.join_next().await {
        let answer = result.expect("task").expect("an answer");
        created += usize::from(answer.status == StatusCode::CREATED);
    }
    assert_eq!(created, 1);
    assert_eq!(api.creates_for_ref("acct-2"), 1);
    assert_eq!(api.count_with_external_ref("acct-2"), 1);

    let mismatch = upsert(&http, &api, "a", &json!({"external_ref": "b"}))
        .await
        .unwrap();
    assert_eq!(mismatch.status, StatusCode::BAD_REQUEST);
    assert_eq!(api.creates(), 2);
}

#[tokio::test]
async fn the_search_lag_hides_a_task_from_searches_but_not_from_lookup_by_id() {
    // Five requests must be answered within the lag for the first half to mean anything: 3 s leaves room on
    // a loaded 2-core CI machine.
    let lag = Duration::from_secs(3);
    let api = start(CrmApi::builder().search_lag(lag)).await;
    let http = reqwest::Client::new();
    let started = tokio::time::Instant::now();
    let created = post_v1(&http, &api, Some("k"), &json!({"external_ref": "late"}))
        .await
        .unwrap();
    assert_eq!(created.status, StatusCode::CREATED);
    let listed = list_by_ref(&http, &api, "late").await;
    let searched = search_by_ref(&http, &api, "late").await;
    let legacy = get(&http, format!("{}/tasks?external_ref=late", api.url())).await;
    let by_id = get(&http, format!("{}/v1/tasks/task-1", api.url())).await;
    assert!(started.elapsed() < lag, "the test machine is too slow");
    assert_eq!(listed.json["data"], json!([]));
    assert_eq!(searched.json["total"], 0);
    assert_eq!(legacy.status, StatusCode::NOT_FOUND);
    assert_eq!(by_id.status, StatusCode::OK);
    assert_eq!(api.creates_for_ref("late"), 1);

    tokio::time::sleep_until(started + lag + Duration::from_millis(50)).await;
    assert_eq!(
        list_by_ref(&http, &api, "late").await.json["data"][0]["id"],
        "task-1"
    );
    assert_eq!(search_by_ref(&http, &api, "late").await.json["total"], 1);
    let legacy = get(&http, format!("{}/tasks?external_ref=late", api.url())).await;
    assert_eq!(legacy.status, StatusCode::OK);
}
