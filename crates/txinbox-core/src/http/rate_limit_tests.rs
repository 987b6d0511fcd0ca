//! A refusal that is a rate limit (a 403 from Salesforce, GitHub, Google): what the effect and its confirmation
//! read from it.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use super::wire_tests::effect;
use super::*;
use crate::effects::EffectState;

/// A destination on loopback answering every request `403 Forbidden` with the extra header lines `headers`
/// (each ending in CRLF) and the JSON `body`.
async fn forbidden(headers: &'static str, body: &'static str) -> String {
    let (url, _) = super::wire_tests::destination(move |_, mut conn| async move {
        let reply = format!(
            "HTTP/1.1 403 Forbidden\r\n{headers}Content-Type: application/json\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n{body}",
            body.len()
        );
        let _ = conn.write_all(reply.as_bytes()).await;
    })
    .await;
    url
}

/// Salesforce's REST API over its API request limit.
const SALESFORCE: &str =
    r#"[{"message":"TotalRequests Limit exceeded.","errorCode":"REQUEST_LIMIT_EXCEEDED"}]"#;
/// A Google API (JSON error format) over a per-user rate limit.
const GOOGLE: &str = r#"{"error":{"errors":[{"domain":"usageLimits","reason":"userRateLimitExceeded","message":"User Rate Limit Exceeded"}],"code":403,"message":"User Rate Limit Exceeded"}}"#;
/// GitHub's REST API over its primary rate limit (with `x-ratelimit-remaining: 0`).
const GITHUB: &str = r#"{"message":"API rate limit exceeded for installation ID 1.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api"}"#;
/// GitHub's REST API over a secondary rate limit, without `retry-after`.
const GITHUB_SECONDARY: &str = r#"{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}"#;

// Salesforce answers its API request limit 403 (errorcodes: "If the error code is REQUEST_LIMIT_EXCEEDED, you've
// exceeded API request limits in your org"), GitHub its rate limits "403 Forbidden or 429 Too Many Requests" with
// "x-ratelimit-remaining" 0 or an error message naming a secondary rate limit, Google Drive "403: User rate limit
// exceeded" ("use an exponential backoff algorithm and try again later"). The default table read every 403 as
// rejected: the effect failed for good, never sent again, though the destination had only said "later". A 4xx
// with a Retry-After says when to come back. Each is not sent: pending again, no sooner than its Retry-After.
#[tokio::test]
async fn a_403_that_is_a_rate_limit_is_not_sent() {
    for (what, headers, body, retry_after) in [
        ("salesforce", "", SALESFORCE, None),
        ("google", "", GOOGLE, None),
        (
            "github primary",
            "X-RateLimit-Limit: 5000\r\nX-RateLimit-Remaining: 0\r\nX-RateLimit-Reset: 1700000000\r\n",
            GITHUB,
            None,
        ),
        ("github secondary", "", GITHUB_SECONDARY, None),
        (
            "retry-after",
            "Retry-After: 30\r\n",
            r#"{"message":"slow down"}"#,
            Some(Duration::from_secs(30)),
        ),
    ] {
        let url = forbidden(headers, body).await;
        let x = HttpEffect::post(format!("{url}/v1/tasks")).build().unwrap();
        match x.execute(&effect()).await {
            Execution::NotSent {
                error,
                retry_after: after,
            } => {
                assert_eq!(after, retry_after, "{what}");
                let error = error.to_string();
                assert!(error.contains("answered 403"), "{what}: {error}");
                assert!(error.contains("rate limit"), "{what}: {error}");
            }
            other => panic!("{what}: read as {other:?}"),
        }
    }
}

// A 403 that says nothing of a rate limit is the refusal it says it is; so is one the user read as rejected
// themselves (`.answer(403, Answer::Rejected)`, or the whole class), marker or not: their entry stands. GitHub's
// header counts only on a 403: the last request a limit allows answers its own 404 or 422 with 0 remaining.
#[tokio::test]
async fn a_refusal_that_is_no_rate_limit_or_that_the_user_chose_stays_rejected() {
    let url = forbidden("", r#"{"message":"forbidden"}"#).await;
    let x = HttpEffect::post(format!("{url}/v1/tasks")).build().unwrap();
    assert!(
        matches!(x.execute(&effect()).await, Execution::Rejected { .. }),
        "a plain 403"
    );
    let url = forbidden("Retry-After: 30\r\n", SALESFORCE).await;
    for (what, builder) in [
        (
            "403",
            HttpEffect::post(format!("{url}/v1/tasks")).answer(403, Answer::Rejected),
        ),
        (
            "4xx",
            HttpEffect::post(format!("{url}/v1/tasks")).answer_class(4, Answer::Rejected),
        ),
    ] {
        let x = builder.build().unwrap();
        match x.execute(&effect()).await {
            Execution::Rejected { error } => {
                assert!(
                    error.to_string().contains("REQUEST_LIMIT_EXCEEDED"),
                    "{what}: {error}"
                )
            }
            other => panic!("{what}: read as {other:?}"),
        }
    }
    let (url, _) = super::wire_tests::destination(|_, mut conn| async move {
        let _ = conn
            .write_all(
                b"HTTP/1.1 404 Not Found\r\nX-RateLimit-Remaining: 0\r\nContent-Type: application/json\r\n\
                  Content-Length: 23\r\nConnection: close\r\n\r\n{\"message\":\"Not Found\"}",
            )
            .await;
    })
    .await;
    let x = HttpEffect::post(format!("{url}/repos/o/r/issues"))
        .build()
        .unwrap();
    assert!(
        matches!(x.execute(&effect()).await, Execution::Rejected { .. }),
        "a 404 with 0 remaining"
    );
}

// A confirmation answered by a rate limit did not search: a reader of the user's that reads every status but 200
// as "not found" read Salesforce's 403 so, and the runner called again an effect that may have happened. It is
// not answered, as a 429 is, before any rule reads it, with the destination's Retry-After.
#[tokio::test]
async fn a_confirmation_answered_by_a_rate_limit_is_not_answered() {
    let loose = |url: &str| {
        Confirm::lookup(format!("{url}/v1/tasks?external_ref={{external_ref}}")).read_with(
            |status, _| match status {
                200 => Confirmation::Done { reference: None },
                _ => Confirmation::NotFound,
            },
        )
    };
    let mut uncertain = effect();
    uncertain.claimed_from = EffectState::Uncertain;
    uncertain.attempts = 1;
    for (what, headers, body, retry_after) in [
        ("salesforce", "", SALESFORCE, None),
        ("google", "", GOOGLE, None),
        (
            "github",
            "Retry-After: 60\r\nX-RateLimit-Remaining: 0\r\n",
            GITHUB,
            Some(Duration::from_secs(60)),
        ),
    ] {
        let url = forbidden(headers, body).await;
        let x = HttpEffect::post(format!("{url}/v1/tasks"))
            .key(Key::none())
            .confirm(loose(&url))
            .build()
            .unwrap();
        match x.confirm(&uncertain).await {
            Confirmation::NotAnswered {
                error,
                retry_after: after,
            } => {
                assert_eq!(after, retry_after, "{what}");
                assert!(
                    error.to_string().contains("come back later"),
                    "{what}: {error}"
                );
            }
            other => panic!("{what}: read as {other:?}"),
        }
    }
    // A plain 403 is the reader's to read.
    let url = forbidden("", r#"{"message":"forbidden"}"#).await;
    let x = HttpEffect::post(format!("{url}/v1/tasks"))
        .key(Key::none())
        .confirm(loose(&url))
        .build()
        .unwrap();
    assert!(matches!(
        x.confirm(&uncertain).await,
        Confirmation::NotFound
    ));
}

// A compensation answered by a rate limit undid nothing: the operator was told only "answered 403 Forbidden",
// which reads as a refusal to undo, and a 404 with a Retry-After read as "already gone", compensated though the
// destination had only said "later". Both say a rate limit, nothing undone, ask again later.
#[tokio::test]
async fn a_compensation_answered_by_a_rate_limit_says_ask_again_later() {
    let mut done = effect();
    done.claimed_from = EffectState::Done;
    done.reference = Some("t-1".into());
    let url = forbidden("", SALESFORCE).await;
    let (later, _) = super::wire_tests::destination(|_, mut conn| async move {
        let _ = conn
            .write_all(
                b"HTTP/1.1 404 Not Found\r\nRetry-After: 30\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
    })
    .await;
    for (what, url, after) in [
        ("salesforce", url, ""),
        ("404 with retry-after", later, "30 s"),
    ] {
        let x = HttpEffect::post(format!("{url}/v1/tasks"))
            .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            .build()
            .unwrap();
        let said = x.compensate(&done).await.expect_err(what).to_string();
        assert!(said.contains("rate limit"), "{what}: {said}");
        assert!(said.contains("nothing undone"), "{what}: {said}");
        assert!(said.contains(after), "{what}: {said}");
    }
}
