//! Destinations on loopback answering in the shapes public APIs send: what the effect reads from them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::*;
use crate::effects::EffectState;

/// A destination on loopback: each connection's request is recorded; `answer` writes the reply.
async fn destination<F, Fut>(answer: F) -> (String, Arc<Mutex<Vec<String>>>)
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
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            loop {
                let Ok(read) = conn.read(&mut chunk).await else {
                    break;
                };
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

fn effect() -> ClaimedEffect {
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
