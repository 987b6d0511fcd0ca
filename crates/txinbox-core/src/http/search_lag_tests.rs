//! A search confirmation at a destination that keeps no key, whose search index lags behind its writes.
//!
//! HubSpot's CRM search (<https://developers.hubspot.com/docs/api/crm/search>, "Limits"): "It may take a few
//! moments for newly created or updated CRM objects to appear in search results." Its create
//! (`POST /crm/v3/objects/{type}`) takes no idempotency key: a second POST creates a second record.

use std::sync::{Arc, Mutex};

use tokio::io::AsyncWriteExt;

use super::wire_tests::{effect, read_request};
use super::*;
use crate::settings::{ConfirmSettings, HttpDestinationSettings};

/// How long the destination's search takes to show a created task: "a few moments", and longer than any real
/// time this test takes, so that only the wait the effect asks for (on tokio's clock) can reach it.
const LAG: Duration = Duration::from_secs(5);

/// What the destination holds: when each task was created, on tokio's clock.
#[derive(Default)]
struct Crm {
    created: Vec<tokio::time::Instant>,
}

/// HubSpot's tasks on loopback: `POST /crm/v3/objects/tasks` creates a task every time (no key); the first
/// create's answer is lost (the connection is closed once the task is created). `POST
/// /crm/v3/objects/tasks/search` answers `{"total": n, "results": [...]}` with the tasks created at least
/// [`LAG`] ago.
async fn hubspot() -> (String, Arc<Mutex<Crm>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let crm = Arc::new(Mutex::new(Crm::default()));
    let held = crm.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let crm = held.clone();
            tokio::spawn(async move {
                let buf = read_request(&mut conn).await;
                let request = String::from_utf8_lossy(&buf).into_owned();
                let body = if request.starts_with("POST /crm/v3/objects/tasks/search ") {
                    let now = tokio::time::Instant::now();
                    let crm = crm.lock().unwrap();
                    let shown: Vec<String> = crm
                        .created
                        .iter()
                        .enumerate()
                        .filter(|(_, at)| now.duration_since(**at) >= LAG)
                        .map(|(i, _)| {
                            format!(
                                r#"{{"id":"{}","properties":{{"external_ref":"ref-1"}}}}"#,
                                512 + i
                            )
                        })
                        .collect();
                    format!(
                        r#"{{"total":{},"results":[{}]}}"#,
                        shown.len(),
                        shown.join(",")
                    )
                } else if request.starts_with("POST /crm/v3/objects/tasks ") {
                    let n = {
                        let mut crm = crm.lock().unwrap();
                        crm.created.push(tokio::time::Instant::now());
                        crm.created.len()
                    };
                    if n == 1 {
                        // Created, and the answer is lost.
                        drop(conn);
                        return;
                    }
                    format!(
                        r#"{{"id":"{}","properties":{{"external_ref":"ref-1"}}}}"#,
                        511 + n
                    )
                } else {
                    String::from(r#"{"status":"error","category":"OBJECT_NOT_FOUND"}"#)
                };
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    (url, crm)
}

const SEARCH_BODY: &str = r#"{"filterGroups":[{"filters":[{"propertyName":"external_ref","operator":"EQ","value":"{external_ref}"}]}]}"#;

/// The destination as docs/effects.md configures HubSpot's tasks, without a `reconcile_after`.
fn builder(url: &str) -> HttpEffectBuilder {
    HttpEffect::post(format!("{url}/crm/v3/objects/tasks"))
        .key(Key::none())
        .reference("/id")
        .confirm(
            Confirm::search_post(format!("{url}/crm/v3/objects/tasks/search"), SEARCH_BODY)
                .count_at("/total")
                .found_at("/results/0/id"),
        )
}

/// The same destination from the settings file, without `reconcile_after_seconds`.
fn from_settings(url: &str) -> HttpEffect {
    let confirm = ConfirmSettings {
        url: format!("{url}/crm/v3/objects/tasks/search"),
        method: Some("POST".into()),
        body: Some(SEARCH_BODY.into()),
        rule: Some("search".into()),
        count_at: Some("/total".into()),
        found_at: Some("/results/0/id".into()),
        ..Default::default()
    };
    let d = HttpDestinationSettings {
        url: format!("{url}/crm/v3/objects/tasks"),
        key: Some("none".into()),
        reference: Some("/id".into()),
        confirm: Some(confirm),
        ..Default::default()
    };
    HttpEffect::from_settings("hubspot", &d, |_| None).unwrap()
}

/// What the runner does with one effect whose first answer is lost: the first confirmation no sooner than
/// the destination's `reconcile_after` after the call (here on tokio's clock, advanced by that much), then a
/// call again only when the confirmation found nothing. How many tasks the destination holds at the end.
async fn lost_answer_reconciled(x: &HttpEffect, crm: &Mutex<Crm>) -> usize {
    let e = effect();
    let first = x.execute(&e).await;
    assert!(
        matches!(first, Execution::Uncertain { .. }),
        "the lost answer: {first:?}"
    );
    tokio::time::pause();
    tokio::time::advance(x.reconcile_after()).await;
    tokio::time::resume();
    match x.confirm(&e).await {
        Confirmation::NotFound => {
            let again = x.execute(&e).await;
            assert!(matches!(again, Execution::Done { .. }), "{again:?}");
        }
        Confirmation::Done { reference } => assert_eq!(reference.as_deref(), Some("512")),
        other => panic!("the confirmation: {other:?}"),
    }
    let n = crm.lock().unwrap().created.len();
    n
}

// Confirmed at once, the lagging search answered `{"total":0,"results":[]}` for the task the lost call had
// created: not found, the effect was called again, and HubSpot held two tasks for one effect. A search at a
// destination that keeps no key now waits DEFAULT_SEARCH_RECONCILE_AFTER by default, from the builder and from
// the settings file alike; a wait the user sets, zero included, is kept.
#[tokio::test]
async fn a_lagging_search_where_no_key_is_kept_creates_once_by_default() {
    for (what, make) in [
        (
            "builder",
            (|url: &str| builder(url).build().unwrap()) as fn(&str) -> HttpEffect,
        ),
        ("settings file", from_settings),
    ] {
        let (url, crm) = hubspot().await;
        let x = make(&url);
        assert_eq!(
            lost_answer_reconciled(&x, &crm).await,
            1,
            "{what}: one task for one effect (reconcile_after {:?})",
            x.reconcile_after()
        );
    }
    // Declared consistent (an explicit zero), the destination is taken at its word: the hazard the default avoids.
    let (url, crm) = hubspot().await;
    let hasty = builder(&url)
        .reconcile_after(Duration::ZERO)
        .build()
        .unwrap();
    assert_eq!(lost_answer_reconciled(&hasty, &crm).await, 2);
}
