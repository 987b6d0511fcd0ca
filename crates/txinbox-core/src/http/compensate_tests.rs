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
