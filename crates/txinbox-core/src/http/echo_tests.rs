//! A destination that echoes the request in its answer (common on an error: the headers it received, the URL
//! it was called at): what the effect keeps of the answer, as evidence and in its log lines, never quotes the
//! request's credentials.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::wire_tests::effect;
use super::*;
use crate::effects::EffectState;

/// A destination on loopback answering every request `status` with a JSON body that echoes what it received
/// (within the first 200 bytes the effect keeps): its request line and its credential headers, as it read them.
async fn echoing(status: &'static str) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                let head = loop {
                    match conn.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                    let text = String::from_utf8_lossy(&buf).into_owned();
                    if let Some(end) = text.find("\r\n\r\n") {
                        break text[..end].to_owned();
                    }
                };
                let mut lines = head.lines();
                let request = lines.next().unwrap_or_default().to_owned();
                let header = |name: &str| {
                    head.lines()
                        .skip(1)
                        .filter_map(|l| l.split_once(':'))
                        .find(|(k, _)| k.trim().eq_ignore_ascii_case(name))
                        .map_or_else(String::new, |(_, v)| v.trim().to_owned())
                };
                let quoted = |s: String| serde_json::Value::String(s).to_string();
                let body = format!(
                    r#"{{"error":"invalid_credentials","req":{},"auth":{},"key":{},"meta":{}}}"#,
                    quoted(request),
                    quoted(header("authorization")),
                    quoted(header("x-api-key")),
                    quoted(header("x-upstream-token")),
                );
                let reply = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = conn.write_all(reply.as_bytes()).await;
            });
        }
    });
    url
}

/// The secrets of the requests below: none may be in what the effect keeps.
const SECRETS: [&str; 5] = [
    "SECRETbearer1",
    "SECRETapikey2",
    "SECRETmeta3",
    "SECRETquery4",
    "SECRETpathtoken5xyz",
];

fn assert_masked(what: &str, error: &str) {
    for secret in SECRETS {
        assert!(!error.contains(secret), "{what}: {secret} in {error}");
    }
}

// A destination echoing the request on an error (its headers, its URL) had its answer kept as the evidence of a
// failed or uncertain effect, and logged: the destination's Authorization and API key, a credential the effect's
// metadata sent, the URL's key and the webhook token of its path were written into the store and the logs.
#[tokio::test]
async fn an_answer_echoing_the_requests_credentials_is_kept_without_them() {
    let mut e = effect();
    e.metadata
        .insert("header.X-Upstream-Token".into(), "SECRETmeta3".into());
    for status in ["401 Unauthorized", "500 Internal Server Error"] {
        let url = echoing(status).await;
        let x = HttpEffect::post(format!(
            "{url}/hooks/SECRETpathtoken5xyz?api_key=SECRETquery4"
        ))
        .header("Authorization", "Bearer SECRETbearer1")
        .header("X-Api-Key", "SECRETapikey2")
        .build()
        .unwrap();
        let error = match x.execute(&e).await {
            Execution::Rejected { error } | Execution::Uncertain { error } => error.to_string(),
            other => panic!("{status}: read as {other:?}"),
        };
        assert_masked(status, &error);
        // The evidence is kept: the status, the destination's own words, what is not a secret.
        assert!(
            error.contains(&format!("answered {}", &status[..3])),
            "{error}"
        );
        assert!(error.contains("invalid_credentials"), "{error}");
    }
    // A compensation answered 2xx with an error, its body kept as evidence.
    let url = echoing("200 OK").await;
    let x = HttpEffect::post(format!("{url}/v1/tasks"))
        .header("Authorization", "Bearer SECRETbearer1")
        .compensate_url(format!(
            "{url}/hooks/SECRETpathtoken5xyz/{{reference}}?api_key=SECRETquery4"
        ))
        .build()
        .unwrap();
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-7".into());
    let error = x.compensate(&done).await.expect_err("an error").to_string();
    assert_masked("compensation", &error);
    assert!(error.contains("invalid_credentials"), "{error}");
}

// A secret echoed across the 200 bytes kept, or escaped as the destination wrote it (JSON with `\/`,
// percent-encoded), is masked all the same: masked before the answer is cut.
#[test]
fn an_echoed_secret_is_masked_whole_escaped_or_cut() {
    let mut secrets = Secrets::default();
    secrets.add_header(&HeaderValue::from_static("Bearer ab/cd+SECRET9="));
    for echoed in ["ab/cd+SECRET9=", "ab\\/cd+SECRET9=", "ab%2Fcd%2BSECRET9%3D"] {
        let body = format!("{}{echoed} and more", "x".repeat(190));
        let shown = excerpt(body.as_bytes(), &secrets);
        assert!(
            !shown.contains("ab/cd") && !shown.contains("ab\\/cd"),
            "{shown}"
        );
        assert!(!shown.contains("ab%2Fcd"), "{shown}");
        assert!(shown.len() <= 200, "{shown}");
        assert!(
            shown.starts_with(&format!("{}***", "x".repeat(190))),
            "{shown}"
        );
    }
    // A value too short to be a credential is not masked in the answer's words.
    let mut short = Secrets::default();
    short.add_header(&HeaderValue::from_static("eu-1"));
    assert_eq!(
        excerpt(b"tenant eu-1 unknown", &short),
        "tenant eu-1 unknown"
    );
}
