//! Destinations on loopback answering in the shapes public APIs send: what the effect reads from them.

use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::effects::EffectState;

/// Reads one request from `conn`: its head and as much body as its `Content-Length` says, or what came before
/// the connection closed or failed.
pub(super) async fn read_request(conn: &mut tokio::net::TcpStream) -> Vec<u8> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    while let Ok(read) = conn.read(&mut chunk).await {
        if read == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..read]);
        let text = String::from_utf8_lossy(&buf).to_ascii_lowercase();
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + length {
                break;
            }
        }
    }
    buf
}

/// A destination on loopback: each connection's request is read whole and recorded; `answer` writes the
/// reply (or drops the connection unanswered). The other HTTP test modules use it too.
pub(super) async fn destination<F, Fut>(answer: F) -> (String, Arc<Mutex<Vec<String>>>)
where
    F: Fn(usize, tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((mut conn, _)) = listener.accept().await {
            let buf = read_request(&mut conn).await;
            log.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&buf).into_owned());
            let a = answer.clone();
            tokio::spawn(a(n, conn));
            n += 1;
        }
    });
    (url, seen)
}

/// A pending effect of destination `crm`, never called: the other HTTP test modules start from it too.
pub(super) fn effect() -> ClaimedEffect {
    ClaimedEffect {
        id: 1,
        consumer: "c".into(),
        message_id: "m".into(),
        key: "0123456789abcdef0123456789abcdef".into(),
        name: "crm.create_task".into(),
        destination: "crm".into(),
        payload: br#"{"title":"t","external_ref":"ref-1"}"#.to_vec(),
        metadata: Default::default(),
        external_ref: "ref-1".into(),
        claimed_from: EffectState::Pending,
        attempts: 0,
        reconciliations: 0,
        created_at: Utc::now(),
        reference: None,
        maybe_happened: false,
        sent_hash: None,
    }
}

const NOT_FOUND: &[u8] =
    b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";

// A compensation by `{reference}` of an effect done without one (a 202 without an id, `reference_optional`):
// the template filled with nothing is the collection's URL (`DELETE /v1/tasks/`), which a destination answers
// 404 (read as "already gone": compensated, nothing undone) or, worse, acts on. It is refused, nothing sent.
#[tokio::test]
async fn a_compensation_by_reference_of_an_effect_without_one_is_refused_unsent() {
    let (url, seen) = destination(|_, mut c| async move {
        let _ = c.write_all(NOT_FOUND).await;
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .reference_optional()
        .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
        .build()
        .unwrap();
    for reference in [None, Some(String::new())] {
        let mut done = effect();
        done.claimed_from = EffectState::Done;
        done.reference = reference.clone();
        let r = e.compensate(&done).await;
        let error = r.expect_err("nothing to name the object by").to_string();
        assert!(error.contains("{reference}"), "{reference:?}: {error}");
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "{:?}",
        seen.lock().unwrap()
    );
    // With a reference, the DELETE names the object, and a 404 is "already gone".
    let mut done = effect();
    done.reference = Some("t-1".into());
    e.compensate(&done).await.expect("gone");
    assert!(seen.lock().unwrap()[0].starts_with("DELETE /v1/tasks/t-1 "));
}

// Stripe takes a form body (`application/x-www-form-urlencoded`), where the external reference is
// percent-encoded (`metadata[external_ref]=followup%3Aopp_1%3Ameeting_2`), and is searched by it: "GET
// /v1/customers/search?query=metadata['external_ref']:'...'" answers `{"object":"search_result","data":[...]}`
// (<https://docs.stripe.com/api/customers/search>). The payload carries the reference, encoded: the search can
// find it. Read as not carried, the confirmation was unknown for ever once Stripe had forgotten the key (24 h),
// and the effect needed attention while Stripe held the customer.
#[tokio::test]
async fn a_form_body_carries_its_percent_encoded_reference() {
    let (url, seen) = destination(|_, mut c| async move {
        let body = r#"{"object":"search_result","data":[{"id":"cus_1","metadata":{"external_ref":"followup:opp_1:meeting 2"}}],"has_more":false}"#;
        let head = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = c.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    let stripe = HttpEffect::post(format!("{url}/v1/customers"))
        .key(Key::header("Idempotency-Key"))
        .confirm(
            Confirm::search(format!(
                "{url}/v1/customers/search?query=metadata%5B%27external_ref%27%5D%3A%27{{external_ref}}%27"
            ))
            .matches_at("/data/0/metadata/external_ref"),
        )
        .build()
        .unwrap();
    for body in [
        "name=Ana&metadata[external_ref]=followup%3Aopp_1%3Ameeting+2",
        "metadata%5Bexternal_ref%5D=followup%3aopp_1%3ameeting%202&name=Ana",
    ] {
        let mut e = effect();
        e.claimed_from = EffectState::Uncertain;
        e.created_at = Utc::now() - chrono::Duration::hours(25);
        e.external_ref = "followup:opp_1:meeting 2".into();
        e.payload = body.as_bytes().to_vec();
        e.metadata.insert(
            meta::CONTENT_TYPE.into(),
            "application/x-www-form-urlencoded".into(),
        );
        match stripe.confirm(&e).await {
            Confirmation::Done { reference } => assert_eq!(reference.as_deref(), Some("cus_1")),
            other => panic!("{body}: {other:?}"),
        }
    }
    assert_eq!(seen.lock().unwrap().len(), 2);
    // A reference the form body does not carry (only a longer one) is still not carried.
    let mut e = effect();
    e.claimed_from = EffectState::Uncertain;
    e.created_at = Utc::now() - chrono::Duration::hours(25);
    e.external_ref = "followup:opp_1".into();
    e.payload = b"metadata[external_ref]=followup%3Aopp_12".to_vec();
    assert!(matches!(
        stripe.confirm(&e).await,
        Confirmation::Unknown { .. }
    ));
}

#[test]
fn only_a_form_body_is_read_form_encoded() {
    let e = HttpEffect::post("https://api.stripe.com/v1/customers")
        .build()
        .unwrap();
    let mut c = effect();
    c.external_ref = "a b:c".into();
    c.payload = br#"{"note":"a+b%3Ac"}"#.to_vec();
    assert!(!e.payload_carries_ref(&c), "JSON is not read as a form");
    c.payload = b"note=a+b%3Ac".to_vec();
    c.metadata.insert(
        meta::CONTENT_TYPE.into(),
        "Application/X-WWW-Form-Urlencoded; charset=utf-8".into(),
    );
    assert!(e.payload_carries_ref(&c));
    assert_eq!(form_decode(b"%zz%4+%41%6a"), b"%zz%4 Aj");
}

// A client of the user's that follows redirects (`.client(reqwest::Client::new())`, against the builder's
// advice). RFC 9110 15.4.4: a 303 "indicates that the server is redirecting the user agent to a different
// resource ... [which] is intended to provide an indirect response to the original request"; GitHub's REST API:
// "Clients should assume that any request may result in a redirection" (302/307: "repeat the request verbatim to
// the URI specified in the Location header"). Followed, the POST became a GET of another resource, or was sent
// again to another host, and that other resource's `{"id": ...}` read as done, its 404 as "not found". An answer
// from another URL than the one called says nothing of the call: uncertain, and unknown for a confirmation.
#[tokio::test]
async fn an_answer_from_a_redirect_the_client_followed_is_not_the_destinations() {
    let (other, seen_other) = destination(|n, mut c| async move {
        let answer: &[u8] = if n == 0 {
            b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{\"id\":\"x\"}"
        } else {
            NOT_FOUND
        };
        let _ = c.write_all(answer).await;
    })
    .await;
    let to = other.clone();
    let (url, _) = destination(move |n, mut c| {
        let to = to.clone();
        async move {
            let (status, path) = if n == 0 {
                ("303 See Other", "/v1/tasks/x")
            } else {
                ("307 Temporary Redirect", "/v1/tasks/lookup")
            };
            let answer = format!(
                "HTTP/1.1 {status}\r\nLocation: {to}{path}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = c.write_all(answer.as_bytes()).await;
        }
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::lookup(format!("{url}/v1/tasks/{{external_ref}}")))
        .client(reqwest::Client::new())
        .build()
        .unwrap();
    let mut call = effect();
    match e.execute(&call).await {
        Execution::Uncertain { error } => {
            assert!(error.to_string().contains("followed a redirect"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    call.claimed_from = EffectState::Uncertain;
    match e.confirm(&call).await {
        Confirmation::Unknown { error } => {
            assert!(error.to_string().contains("followed a redirect"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        seen_other.lock().unwrap().len(),
        2,
        "the client followed both"
    );
}

// The same for a compensation: a DELETE a following client took to another URL, answered 404 there, is not
// "already gone" at the destination.
#[tokio::test]
async fn a_compensation_answered_from_a_redirect_is_refused() {
    let (other, seen_other) = destination(|_, mut c| async move {
        let _ = c.write_all(NOT_FOUND).await;
    })
    .await;
    let to = other.clone();
    let (url, _) = destination(move |_, mut c| {
        let to = to.clone();
        async move {
            let answer = format!(
                "HTTP/1.1 307 Temporary Redirect\r\nLocation: {to}/v2/tasks/t-1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
            let _ = c.write_all(answer.as_bytes()).await;
        }
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
        .client(reqwest::Client::new())
        .build()
        .unwrap();
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-1".into());
    let error = e
        .compensate(&done)
        .await
        .expect_err("not the destination's answer");
    assert!(error.to_string().contains("followed a redirect"), "{error}");
    assert_eq!(seen_other.lock().unwrap().len(), 1);
}

// Message data in a header (`header.X-Tenant` metadata) with CR/LF, or in the URL (`{external_ref}`): nothing
// injected, nothing sent. A header HTTP does not allow refuses the effect before any call, naming the header
// (never its value): "builder error" told the operator nothing.
#[tokio::test]
async fn message_data_with_cr_lf_injects_nothing_and_names_its_header() {
    let (url, seen) = destination(|_, mut c| async move {
        let _ = c
            .write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 10\r\nConnection: close\r\n\r\n{\"id\":\"x\"}")
            .await;
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks/{{external_ref}}"))
        .build()
        .unwrap();
    for (name, value) in [
        ("header.X-Tenant", "acme\r\nX-Injected: s3cret"),
        ("header.X Tenant", "acme"),
        (meta::CONTENT_TYPE, "application/json\r\nX-Injected: s3cret"),
    ] {
        let mut bad = effect();
        bad.metadata.insert(name.into(), value.into());
        match e.execute(&bad).await {
            Execution::Rejected { error } => {
                let error = error.to_string();
                let shown = name.strip_prefix(meta::HEADER).unwrap_or("content-type");
                assert!(
                    error.contains(shown) && error.contains("nothing sent"),
                    "{error}"
                );
                assert!(!error.contains("s3cret"), "{error}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert!(seen.lock().unwrap().is_empty());
    let mut e2 = effect();
    e2.external_ref = "t\r\nX-Injected: 1".into();
    assert!(matches!(e.execute(&e2).await, Execution::Done { .. }));
    let request = seen.lock().unwrap().remove(0);
    assert!(
        request.starts_with("POST /v1/tasks/t%0D%0AX-Injected%3A%201 HTTP/1.1\r\n"),
        "{request}"
    );
}

// A destination that sends its headers and then never finishes the body (or never answers a confirmation):
// bounded by the effect's timeout, uncertain (unknown for a confirmation), never done.
#[tokio::test]
async fn a_body_that_never_ends_is_bounded_by_the_timeout() {
    let (url, _) = destination(|_, mut c| async move {
        let _ = c
            .write_all(b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"id\":")
            .await;
        tokio::time::sleep(std::time::Duration::from_secs(30)).await;
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::lookup(format!("{url}/v1/tasks/{{external_ref}}")))
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    let started = std::time::Instant::now();
    let mut call = effect();
    assert!(matches!(
        e.execute(&call).await,
        Execution::Uncertain { .. }
    ));
    call.claimed_from = EffectState::Uncertain;
    assert!(matches!(
        e.confirm(&call).await,
        Confirmation::Unknown { .. }
    ));
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

// The connection closed after the request was written (a destination or a proxy that drops it mid-call), and a
// body that stops coming: both uncertain, with evidence saying which; "error sending request" and "error
// decoding response body" (reqwest's outer words) told an operator neither.
#[tokio::test]
async fn a_lost_answer_says_how_it_was_lost() {
    let (url, seen) = destination(|n, mut c| async move {
        if n == 0 {
            drop(c);
        } else {
            let _ = c
                .write_all(b"HTTP/1.1 201 Created\r\nContent-Length: 100\r\n\r\n{\"id\":")
                .await;
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
        }
    })
    .await;
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .timeout(std::time::Duration::from_millis(300))
        .build()
        .unwrap();
    for expected in ["connection closed before message completed", "timed out"] {
        match e.execute(&effect()).await {
            Execution::Uncertain { error } => {
                assert!(error.to_string().contains(expected), "{error}")
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen.lock().unwrap().len(), 2, "both were sent");
}

// A 422 at a destination not said to keep keys is its own refusal, not the draft's "key reused": GitHub's REST
// API answers `422 Unprocessable Entity` with `{"message": "Validation Failed", "errors": [...]}` ("Sending
// invalid fields will result in a 422"), and HubSpot's creates take no key at all. Read as a reused key, the
// failed effect's evidence said "the key was used with another body" of a key never sent.
#[tokio::test]
async fn a_422_where_no_key_is_kept_is_a_plain_refusal() {
    let (url, _) = destination(|_, mut c| async move {
        let body = r#"{"message":"Validation Failed","errors":[{"resource":"Issue","field":"title","code":"missing_field"}]}"#;
        let head = format!(
            "HTTP/1.1 422 Unprocessable Entity\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = c.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    for key in [Key::none(), Key::default()] {
        let e = HttpEffect::post(format!("{url}/repos/o/r/issues"))
            .key(key.clone())
            .build()
            .unwrap();
        match e.execute(&effect()).await {
            Execution::Rejected { error } => {
                let error = error.to_string();
                assert!(error.contains("Validation Failed"), "{error}");
                assert!(!error.contains("key was used"), "{key:?}: {error}");
            }
            other => panic!("{other:?}"),
        }
    }
    // Where the key is kept (the draft), the 422 is the key reused, with the hashes as evidence.
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::header("Idempotency-Key"))
        .build()
        .unwrap();
    match e.execute(&effect()).await {
        Execution::Rejected { error } => assert!(error.to_string().contains("key was used")),
        other => panic!("{other:?}"),
    }
}

// A 409 at a destination not said to keep keys is not the draft's "key in progress": HubSpot answers a create
// whose unique property exists already with `409 Conflict` (`{"category": "CONFLICT", "message": "Contact already
// exists..."}`). It is a conflict of the destination's own, uncertain until a confirmation decides; the evidence
// spoke of a key in progress, of a key never sent. Where the key is kept, the 409 is the key in progress.
#[tokio::test]
async fn a_409_where_no_key_is_kept_is_uncertain_not_a_key_in_progress() {
    let (url, _) = destination(|_, mut c| async move {
        let body = r#"{"status":"error","message":"Contact already exists. Existing ID: 123","category":"CONFLICT"}"#;
        let head = format!(
            "HTTP/1.1 409 Conflict\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        );
        let _ = c.write_all(format!("{head}{body}").as_bytes()).await;
    })
    .await;
    let e = HttpEffect::post(format!("{url}/crm/v3/objects/contacts"))
        .key(Key::none())
        .build()
        .unwrap();
    match e.execute(&effect()).await {
        Execution::Uncertain { error } => {
            assert!(error.to_string().contains("already exists"), "{error}")
        }
        other => panic!("{other:?}"),
    }
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::header("Idempotency-Key"))
        .build()
        .unwrap();
    assert!(
        matches!(e.execute(&effect()).await, Execution::InProgress { .. }),
        "the draft's 409 where the key is kept"
    );
}

// A compensation's DELETE carries the key where the destination declared it takes one: PayPal's
// `PayPal-Request-Id`, a `X-Request-Id`. It was always `Idempotency-Key`, a header such a destination ignores (its
// repeat of the DELETE was not deduplicated), and was sent too where the destination keeps no key (`Key::none()`)
// or takes it in the body (`Key::body_field`: a DELETE has no body), against what the destination declared.
#[tokio::test]
async fn a_compensation_sends_the_key_where_the_destination_takes_it() {
    let (url, seen) = destination(|_, mut c| async move {
        let _ = c.write_all(NOT_FOUND).await;
    })
    .await;
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-1".into());
    let compensate_key = format!("{}-compensate", done.key);
    let cases = [
        (Key::header("X-Request-Id"), Some("x-request-id")),
        (Key::header("PayPal-Request-Id"), Some("paypal-request-id")),
        (Key::default(), Some("idempotency-key")),
        (Key::body_field("idempotency_key"), None),
        (Key::none(), None),
    ];
    for (i, (key, header)) in cases.into_iter().enumerate() {
        let e = HttpEffect::post(format!("{url}/v1/tasks"))
            .key(key.clone())
            .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            .build()
            .unwrap();
        e.compensate(&done).await.expect("gone");
        let request = seen.lock().unwrap()[i].to_ascii_lowercase();
        let headers: Vec<&str> = request
            .lines()
            .skip(1)
            .take_while(|l| !l.is_empty())
            .collect();
        let keyed: Vec<&&str> = headers
            .iter()
            .filter(|l| l.contains(&compensate_key))
            .collect();
        match header {
            Some(h) => assert_eq!(
                keyed,
                [&format!("{h}: {compensate_key}").as_str()],
                "{key:?}: {headers:?}"
            ),
            None => assert!(keyed.is_empty(), "{key:?}: {headers:?}"),
        }
        assert!(
            !headers.iter().any(|l| l.starts_with("idempotency-key:"))
                || header == Some("idempotency-key"),
            "{key:?}: {headers:?}"
        );
    }
}

// A confirmation's 429 (Stripe: "Too many requests hit the API too quickly"; HubSpot's search answers it once "the
// rate limit for search requests" is reached) did not search, whatever its body says: not answered, with the
// destination's Retry-After, before any rule reads it. A reader of the user's that reads every status but 200 as
// "not found" read it so, and the runner called again an effect that may have happened. A 503 with Retry-After
// is the same; a 503 without one is an answer that does not say (unknown), and a connection refused reached
// nobody (not answered, no Retry-After).
#[tokio::test]
async fn a_confirmation_asked_to_come_back_is_not_answered() {
    let (url, seen) = destination(|n, mut c| async move {
        let answer: &[u8] = match n {
            0 => b"HTTP/1.1 429 Too Many Requests\r\nRetry-After: 30\r\nContent-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}",
            1 => b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 5\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            _ => b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        };
        let _ = c.write_all(answer).await;
    })
    .await;
    let loose = Confirm::lookup(format!("{url}/v1/tasks?external_ref={{external_ref}}")).read_with(
        |status, _| match status {
            200 => Confirmation::Done { reference: None },
            _ => Confirmation::NotFound,
        },
    );
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(loose)
        .build()
        .unwrap();
    let mut uncertain = effect();
    uncertain.claimed_from = EffectState::Uncertain;
    uncertain.attempts = 1;
    for expected in [Some(30), Some(5)] {
        match e.confirm(&uncertain).await {
            Confirmation::NotAnswered { error, retry_after } => {
                assert_eq!(retry_after, expected.map(std::time::Duration::from_secs));
                assert!(error.to_string().contains("come back later"), "{error}");
            }
            other => panic!("{expected:?}: {other:?}"),
        }
    }
    // The reader's own reading of a 503 without Retry-After stands: that is its contract.
    assert!(matches!(
        e.confirm(&uncertain).await,
        Confirmation::NotFound
    ));
    assert_eq!(seen.lock().unwrap().len(), 3);
    // A search by the built-in rule: a 503 without Retry-After does not say.
    let e = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::search(format!(
            "{url}/v1/tasks?external_ref={{external_ref}}"
        )))
        .build()
        .unwrap();
    assert!(matches!(
        e.confirm(&uncertain).await,
        Confirmation::Unknown { .. }
    ));
    // Nobody listening: nothing reached the destination.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let e = HttpEffect::post(format!("{gone}/v1/tasks"))
        .key(Key::none())
        .confirm(Confirm::search(format!(
            "{gone}/v1/tasks?external_ref={{external_ref}}"
        )))
        .build()
        .unwrap();
    match e.confirm(&uncertain).await {
        Confirmation::NotAnswered { retry_after, .. } => assert_eq!(retry_after, None),
        other => panic!("{other:?}"),
    }
}
