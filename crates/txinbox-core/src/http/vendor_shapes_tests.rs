//! The answers public APIs document, served on loopback as they document them: what the effect reads from each.

use tokio::io::AsyncWriteExt;

use super::wire_tests::effect;
use super::*;

/// A destination on loopback answering every request with `head` (status line and headers) and `body`.
async fn answering(head: String, body: &'static str) -> String {
    let reply = format!(
        "{head}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (url, _) = super::wire_tests::destination(move |_, mut conn| {
        let reply = reply.clone();
        async move {
            let _ = conn.write_all(reply.as_bytes()).await;
        }
    })
    .await;
    url
}

/// What an [`Execution`] is, without its evidence.
fn kind(x: &Execution) -> &'static str {
    match x {
        Execution::Done { .. } => "done",
        Execution::NotSent { .. } => "not_sent",
        Execution::Rejected { .. } => "rejected",
        Execution::InProgress { .. } => "in_progress",
        Execution::Uncertain { .. } => "uncertain",
    }
}

const JSON: &str = "Content-Type: application/json";

// Each row: the vendor's words, the answer as documented, the destination as docs/effects.md configures it, and
// what the effect must read. Nothing done that did not happen; nothing refused (failed) that may have happened.
#[tokio::test]
async fn the_vendors_documented_answers_are_read_as_they_mean() {
    fn keyed(url: &str) -> HttpEffectBuilder {
        HttpEffect::post(format!("{url}/v1/customers"))
            .key(Key::header("Idempotency-Key").kept_for(Duration::from_secs(24 * 3600)))
    }
    fn unkeyed(url: &str) -> HttpEffectBuilder {
        HttpEffect::post(format!("{url}/crm/v3/objects/contacts")).key(Key::none())
    }
    fn upsert(url: &str) -> HttpEffectBuilder {
        HttpEffect::upsert(format!(
            "{url}/sobjects/Task/External_Id__c/{{external_ref}}"
        ))
        .method("PATCH")
    }
    type Dest = fn(&str) -> HttpEffectBuilder;
    let rows: Vec<(&str, String, &'static str, Dest, &str)> = vec![
        // Stripe, https://docs.stripe.com/idempotency: "Subsequent requests with the same key return the same
        // result": a replay says what the first call did.
        (
            "stripe replay",
            format!("HTTP/1.1 200 OK\r\n{JSON}\r\nIdempotent-Replayed: true"),
            r#"{"id":"cus_1","object":"customer"}"#,
            keyed,
            "done",
        ),
        // Stripe, https://docs.stripe.com/error-codes: "idempotency_key_in_use: The idempotency key provided is
        // currently being used in another request."
        (
            "stripe key in use",
            format!("HTTP/1.1 409 Conflict\r\n{JSON}"),
            r#"{"error":{"code":"idempotency_key_in_use","type":"invalid_request_error"}}"#,
            keyed,
            "in_progress",
        ),
        // Stripe: "Idempotency errors occur when an Idempotency-Key is re-used on a request that does not match the
        // first request's API endpoint and parameters": this call did nothing (a refusal; needs attention, not
        // failed, when an earlier call may have happened: the runner's rule).
        (
            "stripe key reused",
            format!("HTTP/1.1 400 Bad Request\r\n{JSON}"),
            r#"{"error":{"type":"idempotency_error","message":"Keys for idempotent requests can only be used with the same parameters they were first used with."}}"#,
            keyed,
            "rejected",
        ),
        // Stripe, lock_timeout: "This object cannot be accessed right now because another API request or Stripe
        // process is currently accessing it"; its idempotency page: "If incoming parameters fail validation, or
        // the request conflicts with another that's executing concurrently, no idempotent result is saved".
        (
            "stripe lock_timeout",
            format!("HTTP/1.1 429 Too Many Requests\r\n{JSON}"),
            r#"{"error":{"code":"lock_timeout","type":"invalid_request_error"}}"#,
            keyed,
            "not_sent",
        ),
        // The IETF draft: "If the request is retried, while the original request is still being processed, the
        // resource SHOULD reply with an HTTP 409"; "reuse an idempotency key with a different request payload, the
        // resource SHOULD reply with a HTTP 422"; a missing key: 400.
        (
            "draft 409",
            format!("HTTP/1.1 409 Conflict\r\n{JSON}"),
            r#"{"title":"A request is outstanding for this Idempotency-Key"}"#,
            keyed,
            "in_progress",
        ),
        (
            "draft 422",
            format!("HTTP/1.1 422 Unprocessable Content\r\n{JSON}"),
            r#"{"title":"Idempotency-Key is already used"}"#,
            keyed,
            "rejected",
        ),
        (
            "draft 400",
            format!("HTTP/1.1 400 Bad Request\r\n{JSON}"),
            r#"{"title":"Idempotency-Key is missing"}"#,
            keyed,
            "rejected",
        ),
        // HubSpot: a create that meets an existing record answers 409 with its id ("Contact already exists.
        // Existing ID: ..."): perhaps this effect's own earlier call: uncertain, a confirmation decides.
        (
            "hubspot exists",
            format!("HTTP/1.1 409 Conflict\r\n{JSON}"),
            r#"{"status":"error","message":"Contact already exists. Existing ID: 2926551","category":"CONFLICT"}"#,
            unkeyed,
            "uncertain",
        ),
        // GitHub: 422 "Validation Failed" with code "already_exists": at a destination that keeps no key, its own
        // refusal (needs attention, not failed, after a call that may have happened: the runner's rule).
        (
            "github already_exists",
            format!("HTTP/1.1 422 Unprocessable Entity\r\n{JSON}"),
            r#"{"message":"Validation Failed","errors":[{"resource":"Label","code":"already_exists","field":"name"}]}"#,
            unkeyed,
            "rejected",
        ),
        // Salesforce upsert: 201 created, 200 updated (with the id), 204 updated (older versions, no body);
        // "If the external ID is matched multiple times, then a 300 error is reported, and the record isn't
        // created or updated" (uncertain by default: 3xx; docs/effects.md sets it rejected for Salesforce).
        (
            "salesforce created",
            format!("HTTP/1.1 201 Created\r\n{JSON}"),
            r#"{"id":"00T000000000001AAA","success":true,"errors":[],"created":true}"#,
            upsert,
            "done",
        ),
        (
            "salesforce updated 204",
            "HTTP/1.1 204 No Content".to_owned(),
            "",
            upsert,
            "done",
        ),
        (
            "salesforce 300",
            format!("HTTP/1.1 300 Multiple Choices\r\n{JSON}"),
            r#"["/services/data/v60.0/sobjects/Task/00T1","/services/data/v60.0/sobjects/Task/00T2"]"#,
            upsert,
            "uncertain",
        ),
        // A 204 to a create that should name what it made: not proof (uncertain unless the reference is optional).
        (
            "204 to a create",
            "HTTP/1.1 204 No Content".to_owned(),
            "",
            keyed,
            "uncertain",
        ),
        // RFC 9110, 15.3.3: "The 202 (Accepted) status code indicates that the request has been accepted for
        // processing, but the processing has not been completed. The request might or might not eventually be acted
        // upon, as it might be disallowed when processing actually takes place." Not done, id or not (the id of a
        // 202 names the pending job, not the finished object): uncertain, the confirmation decides.
        (
            "202 with an id",
            format!("HTTP/1.1 202 Accepted\r\n{JSON}"),
            r#"{"id":"job-1"}"#,
            keyed,
            "uncertain",
        ),
        (
            "202 without an id, reference optional",
            "HTTP/1.1 202 Accepted".to_owned(),
            "",
            |url| keyed(url).reference_optional(),
            "uncertain",
        ),
        // A destination whose 202 means done (an e-mail API taking a send for delivery) says so.
        (
            "202 declared done",
            "HTTP/1.1 202 Accepted".to_owned(),
            "",
            |url| {
                keyed(url)
                    .reference_optional()
                    .answer(202, Answer::Done)
            },
            "done",
        ),
        (
            "202 with an id, 2xx declared done",
            format!("HTTP/1.1 202 Accepted\r\n{JSON}"),
            r#"{"id":"msg-1"}"#,
            |url| keyed(url).answer_class(2, Answer::Done),
            "done",
        ),
        // A 2xx page from a proxy: no reference, not proof.
        (
            "html 200",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html".to_owned(),
            "<!DOCTYPE html><html><body>Please sign in</body></html>",
            keyed,
            "uncertain",
        ),
        // The same page where the reference is optional, or from an upsert: a captive portal's sign-in page, a
        // proxy's or a web application firewall's challenge answered 200 in place of the destination's API, which
        // never saw the call. Not done: uncertain, reconciled.
        (
            "html 200, reference optional",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8".to_owned(),
            "<!DOCTYPE html><html><head><title>Just a moment...</title></head><body>Checking your browser</body></html>",
            |url| keyed(url).reference_optional(),
            "uncertain",
        ),
        (
            "html 200 without a content type, reference optional",
            "HTTP/1.1 200 OK".to_owned(),
            "\n  <html><body>Please sign in to use this network</body></html>",
            |url| unkeyed(url).reference_optional(),
            "uncertain",
        ),
        (
            "xhtml 200 to an upsert",
            "HTTP/1.1 200 OK\r\nContent-Type: application/xhtml+xml".to_owned(),
            "<?xml version=\"1.0\"?><html xmlns=\"http://www.w3.org/1999/xhtml\"><body>Access denied</body></html>",
            upsert,
            "uncertain",
        ),
        // A destination whose own API answers HTML pages (a form endpoint) says so: its page is its answer,
        // done where the reference is optional or for an upsert; where a reference is needed, still uncertain
        // (a page carries none).
        (
            "html 200, reference optional, html answers",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8".to_owned(),
            "<!DOCTYPE html><html><body>Thank you, your request was received</body></html>",
            |url| keyed(url).reference_optional().html_answers(),
            "done",
        ),
        (
            "xhtml 200 to an upsert, html answers",
            "HTTP/1.1 200 OK\r\nContent-Type: application/xhtml+xml".to_owned(),
            "<?xml version=\"1.0\"?><html xmlns=\"http://www.w3.org/1999/xhtml\"><body>Saved</body></html>",
            |url| upsert(url).html_answers(),
            "done",
        ),
        (
            "html 200, reference needed, html answers and a compensation",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html".to_owned(),
            "<!DOCTYPE html><html><body>Saved</body></html>",
            |url| {
                keyed(url)
                    .html_answers()
                    .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            },
            "uncertain",
        ),
        // What reference_optional is for stays done: a 204, an empty 200, JSON without an id, a short answer that
        // is not markup whatever its label, XML that is not a page.
        (
            "204, reference optional",
            "HTTP/1.1 204 No Content".to_owned(),
            "",
            |url| keyed(url).reference_optional(),
            "done",
        ),
        (
            "empty 200, reference optional",
            "HTTP/1.1 200 OK".to_owned(),
            "",
            |url| keyed(url).reference_optional(),
            "done",
        ),
        (
            "JSON without an id, reference optional",
            format!("HTTP/1.1 200 OK\r\n{JSON}"),
            r#"{"ok":true,"status":"queued"}"#,
            |url| keyed(url).reference_optional(),
            "done",
        ),
        (
            "plain ok labelled text/html, reference optional",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html".to_owned(),
            "ok",
            |url| keyed(url).reference_optional(),
            "done",
        ),
        (
            "XML without a page, reference optional",
            "HTTP/1.1 200 OK\r\nContent-Type: application/xml".to_owned(),
            "<?xml version=\"1.0\"?><Response><Status>queued</Status></Response>",
            |url| keyed(url).reference_optional(),
            "done",
        ),
        // A 5xx may come after the request was applied: uncertain, and a 503 without Retry-After too.
        (
            "500",
            format!("HTTP/1.1 500 Internal Server Error\r\n{JSON}"),
            r#"{"error":{"type":"api_error"}}"#,
            keyed,
            "uncertain",
        ),
        (
            "502",
            "HTTP/1.1 502 Bad Gateway".to_owned(),
            "",
            keyed,
            "uncertain",
        ),
        (
            "503 bare",
            "HTTP/1.1 503 Service Unavailable".to_owned(),
            "",
            keyed,
            "uncertain",
        ),
        // RFC 9110, 503: "The server MAY send a Retry-After header field to suggest an appropriate amount of time
        // for the client to wait before retrying the request."
        (
            "503 retry-after",
            "HTTP/1.1 503 Service Unavailable\r\nRetry-After: 30".to_owned(),
            "",
            keyed,
            "not_sent",
        ),
    ];
    let mut misread = Vec::new();
    for (what, head, body, dest, expected) in rows {
        let url = answering(head, body).await;
        let x = dest(&url).build().unwrap();
        let got = x.execute(&effect()).await;
        if kind(&got) != expected {
            misread.push(format!("{what}: expected {expected}, read {got:?}"));
        }
    }
    assert!(misread.is_empty(), "{misread:#?}");
}
