//! A compensation whose answer was lost: what the operator is told.

use super::*;
use crate::effects::{CompensateError, EffectState};

/// A done effect with the destination's reference `t-7`.
fn done() -> ClaimedEffect {
    ClaimedEffect {
        claimed_from: EffectState::Done,
        attempts: 1,
        reference: Some("t-7".into()),
        ..super::wire_tests::effect()
    }
}

// A DELETE that reached the destination and whose answer was lost (the connection closed after the request was
// read: the destination may have deleted the task) was told as "the destination did not undo effect ...", and
// the row as "refused by the destination, still done": the operator read that the destination still held what
// it may have deleted. The evidence says the answer was lost and the effect may have been undone; the runner's
// error says the destination did not confirm it. A DELETE that reached nobody says so.
#[tokio::test]
async fn a_compensation_whose_answer_was_lost_says_it_may_have_undone() {
    // The request read whole, then the connection closed unanswered.
    let (url, _) = super::wire_tests::destination(|_, conn| async move { drop(conn) }).await;
    let x = HttpEffect::post(format!("{url}/v1/tasks"))
        .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
        .build()
        .unwrap();
    let source = x.compensate(&done()).await.expect_err("no answer");
    let said = source.to_string();
    assert!(said.contains("may have undone"), "{said}");
    let refused = CompensateError::Refused {
        key: "k".into(),
        source,
    }
    .to_string();
    assert!(!refused.contains("did not undo"), "{refused}");

    // Nobody listening: nothing was undone, and it says so.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let gone = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let x = HttpEffect::post(format!("{gone}/v1/tasks"))
        .compensate_url(format!("{gone}/v1/tasks/{{reference}}"))
        .build()
        .unwrap();
    let said = x.compensate(&done()).await.expect_err("nobody").to_string();
    assert!(said.contains("reached nobody"), "{said}");
}

/// A destination on loopback answering every request with `reply` (a whole HTTP answer).
async fn answering(reply: &'static str) -> String {
    use tokio::io::AsyncWriteExt;
    let (url, _) = super::wire_tests::destination(move |_, mut conn| async move {
        let _ = conn.write_all(reply.as_bytes()).await;
    })
    .await;
    url
}

// A DELETE answered 202 or with an HTML page was read as undone. RFC 9110 (9.3.5, DELETE): "the origin server
// SHOULD send a 202 (Accepted) status code if the action will likely succeed but has not yet been enacted": not
// undone yet. An HTML page answered 200 (a captive portal's sign-in page, a proxy's or a firewall's challenge)
// is not the destination's API answering: nothing says it deleted anything. Both undid nothing yet; asking
// again is safe (what is gone answers 404). A 204, or a 200 with JSON, is undone.
#[tokio::test]
async fn a_compensation_accepted_or_answered_by_a_page_is_not_undone() {
    let mut misread = Vec::new();
    for (what, reply, undone) in [
        (
            "202",
            "HTTP/1.1 202 Accepted\r\nContent-Type: application/json\r\nContent-Length: 20\r\nConnection: close\r\n\r\n{\"status\":\"pending\"}",
            false,
        ),
        (
            "html page",
            "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 55\r\nConnection: close\r\n\r\n<!DOCTYPE html><html><body>Please sign in</body></html>",
            false,
        ),
        (
            "204",
            "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n",
            true,
        ),
        (
            "200 json",
            "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 30\r\nConnection: close\r\n\r\n{\"id\":\"t-7\",\"archived\":true}  ",
            true,
        ),
    ] {
        let url = answering(reply).await;
        let x = HttpEffect::post(format!("{url}/v1/tasks"))
            .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
            .build()
            .unwrap();
        let got = x.compensate(&done()).await;
        if got.is_ok() != undone {
            misread.push(format!("{what}: {got:?}"));
        }
    }
    assert!(misread.is_empty(), "{misread:#?}");
}

// A destination whose own API answers HTML pages (`html_answers`) undoes with a page too: read as its answer.
#[tokio::test]
async fn a_compensation_answered_by_a_page_is_undone_where_the_api_answers_pages() {
    let url = answering(
        "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 48\r\nConnection: close\r\n\r\n<!DOCTYPE html><html><body>Deleted</body></html>",
    )
    .await;
    let x = HttpEffect::post(format!("{url}/v1/tasks"))
        .html_answers()
        .compensate_url(format!("{url}/v1/tasks/{{reference}}"))
        .build()
        .unwrap();
    x.compensate(&done())
        .await
        .expect("undone by the API's own page");
}
