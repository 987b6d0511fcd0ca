//! What a destination answers, read as it means it, on SQLite and PostgreSQL: nothing is marked done that did not
//! happen, nothing failed that may have happened. Each test drives one answer through the runner and checks the
//! effect's state, its evidence and the tasks at the destination.

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::*;
use txinbox::driver::EffectStore;
use txinbox::http::{Answer, Confirm, HttpEffect, HttpEffectBuilder, Key};
use txinbox::{EffectOptions, EffectRunner, EffectState, Store};
use txinbox_crm_api::{CrmApi, KeyMode};
use txinbox_e2e::{pg_store, sqlite_store};

fn opts() -> EffectOptions {
    EffectOptions::default()
        .backoff(Duration::ZERO, Duration::ZERO)
        .max_attempts(3)
        .max_reconciliations(3)
}

fn runner<DB: FxDb>(store: &Store<DB>, d: HttpEffectBuilder) -> EffectRunner<Store<DB>> {
    EffectRunner::new(store.clone())
        .executor("crm", d.build().expect("a valid destination"))
        .options(opts())
}

/// Records one CRM effect (lab message 0) and returns its idempotency key.
async fn one_effect<DB: FxDb>(
    store: &Store<DB>,
    effect: fn(&txinbox::Message<txinbox_lab::lab::LabEvent>) -> txinbox::Effect,
) -> String {
    DB::create_tables(store).await.unwrap();
    let (h, ids) = recording::<DB>(move |msg| vec![effect(msg)]);
    assert_all_applied(&deliver(store, h, 0..1).await, 1);
    keys(&ids, CRM_TASK).remove(0)
}

async fn state<DB: FxDb>(store: &Store<DB>, key: &str) -> txinbox::effects::ClaimedEffect {
    store
        .find_effect(key)
        .await
        .expect("read the effect")
        .expect("the effect exists")
}

async fn last_error<DB: FxDb>(store: &Store<DB>) -> String {
    DB::effect_rows(store)
        .await
        .remove(0)
        .last_error
        .unwrap_or_default()
}

macro_rules! on_both {
    ($f:ident, $lite:ident, $pg:ident) => {
        #[tokio::test]
        async fn $lite() {
            $f(sqlite_store().await).await;
        }
        #[tokio::test]
        async fn $pg() {
            $f(pg_store(4).await).await;
        }
    };
}

// A 2xx whose body lacks the declared reference did not say it did it: uncertain, reconciled, then done with
// the destination's reference. Declared optional, it is done without reference, counted apart.
async fn a_2xx_without_its_reference<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder().start().await.unwrap();
    let url = crm.url();
    let strict = HttpEffect::post(format!("{url}/tasks"))
        .key(Key::header("Idempotency-Key"))
        .reference("/task_id")
        .confirm_url(format!("{url}/tasks?idempotency_key={{key}}"));
    let first = runner(&store, strict).run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "{first}");
    assert!(last_error(&store)
        .await
        .contains("without a reference at /task_id"));
    let e = state(&store, &key).await;
    assert!(e.maybe_happened, "a 2xx may have done it");
    let crm2 = crm.clone();
    let strict = HttpEffect::post(format!("{url}/tasks"))
        .key(Key::header("Idempotency-Key"))
        .reference("/task_id")
        .confirm_url(format!("{url}/tasks?idempotency_key={{key}}"));
    let _report = runner(&store, strict).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::Done);
    assert_eq!(e.reference, crm2.tasks().first().map(|t| t.id.clone()));
    assert_eq!(crm.creates(), 1);

    // The same answer, declared able to carry no reference: done without reference, shown apart.
    let store2 = store.clone();
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store2, h, 1..2).await, 1);
    let key2 = keys(&ids, CRM_TASK).remove(0);
    let optional = HttpEffect::post(format!("{url}/tasks"))
        .reference("/task_id")
        .reference_optional();
    let _report = runner(&store, optional).run_until_idle().await;
    let e = state(&store, &key2).await;
    assert_eq!((e.claimed_from, e.reference), (EffectState::Done, None));
    let counts = store.effect_counts().await.unwrap();
    let done = counts
        .iter()
        .find(|c| c.state == EffectState::Done)
        .expect("done effects");
    assert_eq!((done.count, done.without_reference), (2, 1));
}
on_both!(
    a_2xx_without_its_reference,
    a_2xx_without_its_reference_is_uncertain_never_done_on_sqlite,
    a_2xx_without_its_reference_is_uncertain_never_done_on_postgres
);

// The draft's 422: the key was used with another body. Failed when nothing of ours may have happened, with the
// body's hash; needs attention when an earlier call of ours may have happened, with both hashes.
async fn a_reused_key<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder().start().await.unwrap();
    let url = crm.url();
    let http = http_post(
        &format!("{url}/tasks"),
        &key,
        r#"{"title":"someone else's"}"#,
    )
    .await;
    assert_eq!(http, 201);
    let d = || {
        HttpEffect::post(format!("{url}/tasks"))
            .key(Key::header("Idempotency-Key"))
            .confirm_url(format!("{url}/tasks?idempotency_key={{key}}"))
    };
    let r = runner(&store, d()).run_until_idle().await;
    assert_eq!(r.count(EffectState::Failed), 1, "{r}");
    let error = last_error(&store).await;
    assert!(error.contains("answered 422"), "{error}");
    assert!(error.contains("this body sha256="), "{error}");
    assert!(
        error.contains("no earlier call under this key was recorded"),
        "{error}"
    );
    assert_eq!(crm.creates(), 1, "only the other sender's");

    // A first call lost at a gateway (it may have happened), then another sender takes the key: the repeat's
    // 422 is not "nothing happened".
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 1..2).await, 1);
    let key2 = keys(&ids, CRM_TASK).remove(0);
    crm.gateway_504_next(0);
    crm.gateway_502_next(1);
    let no_search = || HttpEffect::post(format!("{url}/tasks")).key(Key::header("Idempotency-Key"));
    let first = runner(&store, no_search()).run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "{first}");
    let e = state(&store, &key2).await;
    let sent = e
        .sent_hash
        .clone()
        .expect("the first call's body hash is kept");
    assert_eq!(
        http_post(&format!("{url}/tasks"), &key2, r#"{"x":1}"#).await,
        201
    );
    let r = runner(&store, no_search()).run_until_idle().await;
    assert_eq!(r.count(EffectState::NeedsAttention), 1, "{r}");
    let e = state(&store, &key2).await;
    assert_eq!(e.claimed_from, EffectState::NeedsAttention);
    let rows = DB::effect_rows(&store).await;
    let error = rows[1].last_error.clone().unwrap_or_default();
    assert!(
        error.contains(&format!("this body sha256={sent}")),
        "{error}"
    );
    assert!(error.contains("sent the same body"), "{error}");
}
on_both!(
    a_reused_key,
    a_reused_key_fails_with_its_evidence_or_needs_attention_on_sqlite,
    a_reused_key_fails_with_its_evidence_or_needs_attention_on_postgres
);

/// A POST with an `Idempotency-Key`, through a plain TCP connection (the tests' own client).
async fn http_post(url: &str, key: &str, body: &str) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.trim_start_matches("http://");
    let (host, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut c = tokio::net::TcpStream::connect(host).await.expect("connect");
    let req = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nIdempotency-Key: {key}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    c.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).await.unwrap();
    out.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

// 429 and 503 with Retry-After (seconds, or an HTTP-date): nothing happened, sent again no sooner than asked.
async fn retry_after<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder().start().await.unwrap();
    let url = crm.url();
    let d = || {
        HttpEffect::post(format!("{url}/tasks"))
            .key(Key::header("Idempotency-Key"))
            .confirm_url(format!("{url}/tasks?idempotency_key={{key}}"))
    };
    for (as_date, arm) in [(false, 429), (true, 503)] {
        crm.set_retry_after(2, as_date);
        if arm == 429 {
            crm.rate_limit_next(1);
        } else {
            crm.unavailable_next(1);
        }
        let before = chrono::Utc::now();
        let r = runner(&store, d()).run_until_idle().await;
        assert_eq!(r.count(EffectState::Pending), 1, "{arm}: not sent: {r}");
        let row = DB::effect_rows(&store).await.remove(0);
        assert_eq!(row.state, "pending");
        assert!(
            row.next_attempt_at >= before + chrono::Duration::milliseconds(1000),
            "{arm}: due again at {} (asked 2 s from {before})",
            row.next_attempt_at
        );
        assert!(!state(&store, &key).await.maybe_happened);
        assert_eq!(crm.creates(), 0, "{arm}");
        // Nothing is due before then.
        assert_eq!(runner(&store, d()).run_until_idle().await.claimed, 0);
        let wait = (row.next_attempt_at - chrono::Utc::now())
            .to_std()
            .unwrap_or_default();
        tokio::time::sleep(wait + Duration::from_millis(50)).await;
        if arm == 503 {
            let r = runner(&store, d()).run_until_idle().await;
            assert_eq!(r.count(EffectState::Done), 1, "{r}");
        }
    }
    assert_eq!(crm.creates(), 1);
}
on_both!(
    retry_after,
    retry_after_is_honoured_on_sqlite,
    retry_after_is_honoured_on_postgres
);

/// The CRM's `/v1` create at a destination that keeps no key, confirmed by a search by external reference. The
/// fake CRM's search shows a task at once (no `search_lag`): declared with a zero `reconcile_after`, instead of
/// the minute a search where no key is kept waits by default.
fn searched_without_key(crm: &CrmApi) -> HttpEffectBuilder {
    let url = crm.url();
    HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::search(format!(
            "{url}/v1/tasks?external_ref={{external_ref}}"
        )))
        .reconcile_after(Duration::ZERO)
}

// A confirmation answered 429 with Retry-After (HubSpot's search: "429 Too Many Requests" once "the rate limit
// for search requests" is reached) did not search: the effect stays uncertain, is not asked again before the
// destination said, and is never called again meanwhile. Read as an unknown answer, it was asked again at once
// (at the runner's backoff), against a destination that had asked for two minutes.
async fn a_rate_limited_confirmation<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder()
        .key_mode(KeyMode::None)
        .start()
        .await
        .unwrap();
    let d = || searched_without_key(&crm);
    crm.drop_next_answers(1);
    let first = runner(&store, d()).run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "{first}");
    crm.set_retry_after(120, false);
    crm.rate_limit_next_searches(1);
    let before = chrono::Utc::now();
    let second = runner(&store, d()).run_pass().await;
    assert_eq!(second.count(EffectState::Uncertain), 1, "{second}");
    let row = DB::effect_rows(&store).await.remove(0);
    assert_eq!((row.state.as_str(), row.reconciliations), ("uncertain", 1));
    assert!(
        row.next_attempt_at >= before + chrono::Duration::seconds(110),
        "asked again at {} (Retry-After 120 s from {before})",
        row.next_attempt_at
    );
    assert!(
        row.last_error.as_deref().unwrap_or("").contains("429"),
        "{:?}",
        row.last_error
    );
    // Nothing is due before then: not asked, not called.
    assert_eq!(runner(&store, d()).run_until_idle().await.claimed, 0);
    assert!(state(&store, &key).await.maybe_happened);
    assert_eq!(crm.creates(), 1, "never sent twice");
}
on_both!(
    a_rate_limited_confirmation,
    a_rate_limited_confirmation_waits_its_retry_after_on_sqlite,
    a_rate_limited_confirmation_waits_its_retry_after_on_postgres
);

// A refusal after a call that may have happened (a gateway's 504 after the destination acted) is not
// "nothing happened": it needs attention, never failed.
async fn refused_after_maybe<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let (url, hits) = canned(vec![
        "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\nContent-Length: 22\r\nConnection: close\r\n\r\n{\"error\":\"bad field\"} ",
    ])
    .await;
    let d = HttpEffect::post(format!("{url}/tasks")).key(Key::header("Idempotency-Key"));
    let _report = runner(&store, d).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::NeedsAttention, "{e:?}");
    assert!(last_error(&store).await.contains("may have done it"));
    assert_eq!(hits.load(Ordering::SeqCst), 2, "the 504, then the repeat");
    assert_eq!(
        DB::effect_rows(&store).await[0].attempts,
        2,
        "both calls counted"
    );
}
on_both!(
    refused_after_maybe,
    a_refusal_after_a_call_that_may_have_happened_needs_attention_on_sqlite,
    a_refusal_after_a_call_that_may_have_happened_needs_attention_on_postgres
);

// A call that may have happened (a gateway's 504), repeated under its kept key, and the repeat refused
// as not sent (429): the next call waits for a confirmation, which the destination cannot give once the
// key is older than it keeps keys, so nothing is sent again blind (the repeat's retry went out without
// asking, after the key could have been forgotten).
async fn not_sent_after_maybe<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let (url, hits) = canned(vec![
        "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 429 Too Many Requests\r\nRetry-After: 1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    ])
    .await;
    let kept = HttpEffect::post(format!("{url}/tasks")).key(Key::header("Idempotency-Key"));
    let _report = runner(&store, kept).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::Uncertain, "{e:?}");
    assert!(last_error(&store).await.contains("may have done it"));
    assert_eq!(hits.load(Ordering::SeqCst), 2, "the 504, then the repeat");
    // Due again after the Retry-After; by then the destination keeps keys for less than the effect's age.
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let forgotten = HttpEffect::post(format!("{url}/tasks"))
        .key(Key::header("Idempotency-Key").kept_for(Duration::ZERO));
    let _report = runner(&store, forgotten).run_until_idle().await;
    assert_eq!(
        hits.load(Ordering::SeqCst),
        2,
        "no call without a confirmation"
    );
    let e = state(&store, &key).await;
    assert!(
        matches!(
            e.claimed_from,
            EffectState::Uncertain | EffectState::NeedsAttention
        ),
        "{e:?}"
    );
    assert!(e.maybe_happened);
}
on_both!(
    not_sent_after_maybe,
    a_repeat_not_sent_is_confirmed_before_the_next_call_on_sqlite,
    a_repeat_not_sent_is_confirmed_before_the_next_call_on_postgres
);

// Redirects are not followed (a POST redirected as a GET could read as done), and a 2xx that is not the
// destination's (an HTML page) carries no reference: both uncertain, never done.
async fn not_the_destinations_answer<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let (url, hits) = canned(vec![
        "HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\nConnection: close\r\n\r\n<html></html>",
    ])
    .await;
    let d = || HttpEffect::post(format!("{url}/tasks")).key(Key::none());
    let first = runner(&store, d()).run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "the 302: {first}");
    assert_eq!(
        hits.load(Ordering::SeqCst),
        1,
        "the redirect was not followed"
    );
    // No confirmation and no key: never called again blindly.
    let _report = runner(&store, d()).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::NeedsAttention);
    assert_eq!(hits.load(Ordering::SeqCst), 1);
}
on_both!(
    not_the_destinations_answer,
    a_redirect_is_not_followed_and_never_done_on_sqlite,
    a_redirect_is_not_followed_and_never_done_on_postgres
);

/// An effect whose payload does not carry its external reference (the default reference is its key).
fn effect_without_ref_in_payload(
    msg: &txinbox::Message<txinbox_lab::lab::LabEvent>,
) -> txinbox::Effect {
    txinbox::Effect::json(
        CRM_TASK,
        "crm",
        &serde_json::json!({"title": "follow up", "meeting": msg.body.meeting}),
    )
    .unwrap()
}

// A search by an external reference the payload does not carry could never find the call: unknown, never
// "not found" (which would send it again to a destination without idempotency).
async fn search_by_a_reference_not_sent<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, effect_without_ref_in_payload).await;
    let crm = CrmApi::builder()
        .key_mode(KeyMode::None)
        .start()
        .await
        .unwrap();
    let d = || searched_without_key(&crm);
    crm.drop_next_answers(1);
    let _report = runner(&store, d()).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::NeedsAttention, "{e:?}");
    assert!(last_error(&store)
        .await
        .contains("does not carry the external reference"));
    assert_eq!(crm.creates(), 1, "never sent twice");
}
on_both!(
    search_by_a_reference_not_sent,
    a_search_by_a_reference_the_payload_lacks_is_unknown_on_sqlite,
    a_search_by_a_reference_the_payload_lacks_is_unknown_on_postgres
);

// A key the destination keeps is its own confirmation within the time it keeps it; past that time it is never
// repeated blindly.
async fn a_kept_key_and_its_retention<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder()
        .key_mode(KeyMode::Header("PayPal-Request-Id".into()))
        .start()
        .await
        .unwrap();
    let url = crm.url();
    crm.drop_next_answers(1);
    let d = HttpEffect::post(format!("{url}/v1/tasks")).key(Key::header("PayPal-Request-Id"));
    let r = runner(&store, d).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::Done, "{r}");
    assert_eq!(e.reference, crm.tasks().first().map(|t| t.id.clone()));
    assert_eq!(
        (crm.attempts(), crm.creates()),
        (2, 1),
        "repeated once, replayed"
    );

    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 1..2).await, 1);
    let key2 = keys(&ids, CRM_TASK).remove(0);
    crm.drop_next_answers(1);
    let expired = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::header("PayPal-Request-Id").kept_for(Duration::ZERO));
    let _report = runner(&store, expired).run_until_idle().await;
    let e = state(&store, &key2).await;
    assert_eq!(e.claimed_from, EffectState::NeedsAttention);
    assert!(DB::effect_rows(&store).await[1]
        .last_error
        .as_deref()
        .is_some_and(|m| m.contains("older than the destination keeps keys")));
    assert_eq!(
        crm.creates(),
        2,
        "the second effect's call once, never repeated"
    );
}
on_both!(
    a_kept_key_and_its_retention,
    a_kept_key_is_repeated_only_while_the_destination_keeps_it_on_sqlite,
    a_kept_key_is_repeated_only_while_the_destination_keeps_it_on_postgres
);

// A call that outlasts the claim (a destination that takes the request and never answers, a timeout longer
// than `claim_for`): the holder gives the work up at `claim_for`, and the claim it took outlasts that by the
// destination's `reconcile_after`, so the next holder asks the destination no sooner than that after the
// call. The claim ended at `claim_for`, possibly while the call was still out, and the next holder could
// search a lagging destination before the call showed there, and call again.
async fn a_call_longer_than_its_claim<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let silent = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    let d = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::search(format!(
            "{url}/v1/tasks?external_ref={{external_ref}}"
        )))
        .timeout(Duration::from_secs(30))
        .reconcile_after(Duration::from_secs(5));
    let runner = EffectRunner::new(store.clone())
        .executor("crm", d.build().expect("a valid destination"))
        .options(opts().claim_for(Duration::from_millis(300)));
    let before = chrono::Utc::now();
    let r = runner.run_pass().await;
    assert_eq!(r.claims_lost, 1, "{r:?}");
    let row = DB::effect_rows(&store).await.remove(0);
    assert_eq!(row.state, "in_flight");
    let until = row.claim_until.expect("claimed");
    assert!(
        until >= before + chrono::Duration::milliseconds(5_300),
        "the claim outlasts the work by reconcile_after: until {until}, claimed at {before}"
    );
    let e = state(&store, &key).await;
    assert_eq!(e.claimed_from, EffectState::InFlight);
    silent.abort();
}
on_both!(
    a_call_longer_than_its_claim,
    a_call_longer_than_its_claim_is_given_up_and_its_claim_outlasts_it_on_sqlite,
    a_call_longer_than_its_claim_is_given_up_and_its_claim_outlasts_it_on_postgres
);

// A search the destination answers with other objects (it ignored a filter it does not know): with
// `matches_at`, what was found must carry the effect's reference, else the answer is unknown; never done
// with another object's id. Without it, the first object of an unfiltered list read as this effect, done.
async fn a_search_that_ignores_its_filter<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let (url, hits) = canned(vec![
        "HTTP/1.1 504 Gateway Timeout\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 50\r\nConnection: close\r\n\r\n{\"data\":[{\"id\":\"t-other\",\"external_ref\":\"other\"}]}",
    ])
    .await;
    let d = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(
            Confirm::search(format!("{url}/v1/tasks?externl_ref={{external_ref}}"))
                .matches_at("/data/0/external_ref"),
        )
        // Searched at once (the default waits a minute where no key is kept).
        .reconcile_after(Duration::ZERO);
    let _report = runner(&store, d).run_until_idle().await;
    let e = state(&store, &key).await;
    assert_ne!(e.claimed_from, EffectState::Done, "{e:?}");
    assert_eq!(e.reference, None);
    assert!(last_error(&store).await.contains("not this effect"));
    assert!(
        hits.load(Ordering::SeqCst) >= 2,
        "the call, then the search"
    );
}
on_both!(
    a_search_that_ignores_its_filter,
    a_search_answered_with_another_object_is_never_done_on_sqlite,
    a_search_answered_with_another_object_is_never_done_on_postgres
);

// A search that lags behind the writes would not find a fresh task: reconcile_after waits for it. Without
// it, a destination with no key gets the task twice (what the setting is for).
async fn a_lagging_search<DB: FxDb>(store: Store<DB>) {
    DB::create_tables(&store).await.unwrap();
    let (h, ids) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 0..2).await, 2);
    let keys = keys(&ids, CRM_TASK);
    let crm = CrmApi::builder()
        .key_mode(KeyMode::None)
        // The hasty runner below must search before the lag ends: 2 s leaves room on a loaded machine.
        .search_lag(Duration::from_secs(2))
        .start()
        .await
        .unwrap();
    let url = crm.url();
    let d = |wait: Duration| {
        HttpEffect::post(format!("{url}/v1/tasks"))
            .key(Key::none())
            .confirm(Confirm::search(format!(
                "{url}/v1/tasks?external_ref={{external_ref}}"
            )))
            .reconcile_after(wait)
    };
    let patient = runner(&store, d(Duration::from_secs(3)));
    crm.drop_next_answers(1);
    let first = patient.run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "{first}");
    assert_eq!(first.count(EffectState::Done), 1, "{first}");
    assert_eq!(
        patient.run_until_idle().await.claimed,
        0,
        "not due before the wait"
    );
    tokio::time::sleep(Duration::from_millis(3100)).await;
    let _report = patient.run_until_idle().await;
    for k in &keys {
        assert_eq!(state(&store, k).await.claimed_from, EffectState::Done);
    }
    assert_eq!(crm.creates(), 2, "one task per effect");

    // Without the wait, the search does not see the task yet: not found, the call is made again, and a
    // destination without a key creates it twice. This is what the setting is for.
    let (h, _) = recording::<DB>(|msg| vec![crm_effect(msg)]);
    assert_all_applied(&deliver(&store, h, 2..3).await, 1);
    let hasty = runner(&store, d(Duration::ZERO));
    crm.drop_next_answers(1);
    let _report = hasty.run_until_idle().await;
    // lab message 2's follow-up, as crm_effect names it.
    let reference = "followup:oportunidade_2483:reuniao_186";
    assert_eq!(
        crm.creates_for_ref(reference),
        2,
        "the hazard reconcile_after avoids"
    );
}
on_both!(
    a_lagging_search,
    a_lagging_search_is_asked_after_reconcile_after_on_sqlite,
    a_lagging_search_is_asked_after_reconcile_after_on_postgres
);

// A "not found" inside a search's lag is not proof that the call did nothing: a refusal of the call made after
// it (here a 503 the destination's table reads as a refusal, as an API that answers a second create of one
// reference "already exists" would) leaves the effect needing attention, never failed: the first call created
// the task. The confirmation cleared the "may have happened" flag, and the effect was marked failed with the
// task at the CRM.
async fn a_refusal_after_a_lagging_not_found<DB: FxDb>(store: Store<DB>) {
    let key = one_effect(&store, crm_effect).await;
    let crm = CrmApi::builder()
        .key_mode(KeyMode::None)
        .search_lag(Duration::from_secs(60))
        .start()
        .await
        .unwrap();
    let url = crm.url();
    let r = runner(
        &store,
        HttpEffect::post(format!("{url}/v1/tasks"))
            .key(Key::none())
            .confirm(Confirm::search(format!(
                "{url}/v1/tasks?external_ref={{external_ref}}"
            )))
            // Searched inside the lag on purpose (the default waits a minute where no key is kept).
            .reconcile_after(Duration::ZERO)
            .answer(503, Answer::Rejected),
    );
    crm.drop_next_answers(1);
    let first = r.run_pass().await;
    assert_eq!(first.count(EffectState::Uncertain), 1, "{first}");
    crm.fail_next(1);
    let second = r.run_until_idle().await;
    let e = state(&store, &key).await;
    assert_eq!(
        e.claimed_from,
        EffectState::NeedsAttention,
        "{second}: refused after a not found the lag can answer"
    );
    // lab message 0's follow-up, as crm_effect names it.
    assert_eq!(
        crm.creates_for_ref("followup:oportunidade_2481:reuniao_184"),
        1,
        "the first call created it"
    );
}
on_both!(
    a_refusal_after_a_lagging_not_found,
    a_refusal_after_a_lagging_not_found_needs_attention_on_sqlite,
    a_refusal_after_a_lagging_not_found_needs_attention_on_postgres
);
