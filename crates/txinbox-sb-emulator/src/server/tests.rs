//! Unit tests of the request parsers: routes, the control-API prefix and batch bodies.

use hyper::Method;

use super::*;

#[test]
fn routes_split_on_the_messages_segment() {
    let route = parse_route(&Method::POST, "/a/b/messages").unwrap();
    assert!(matches!(route, Route::Send { entity } if entity == "a/b"));
    let route = parse_route(&Method::DELETE, "/q/$DeadLetterQueue/messages/head").unwrap();
    assert!(
        matches!(route, Route::Receive { entity, mode: ReceiveMode::ReceiveAndDelete } if entity == "q/$DeadLetterQueue")
    );
    let route = parse_route(&Method::PUT, "/t/subscriptions/s/messages/7/abc").unwrap();
    assert!(
        matches!(route, Route::Lock { entity, id, token, operation: LockOperation::Abandon }
        if entity == "t/subscriptions/s" && id == "7" && token == "abc")
    );
    assert_eq!(parse_route(&Method::GET, "/q/messages").unwrap_err().0, 405);
    assert_eq!(parse_route(&Method::POST, "/q").unwrap_err().0, 400);
    assert_eq!(parse_route(&Method::POST, "/messages").unwrap_err().0, 400);
}

#[test]
fn admin_prefix_is_recognised() {
    assert_eq!(strip_admin_prefix("/$emulator/queues/x"), Some("/queues/x"));
    assert_eq!(strip_admin_prefix("/$EMULATOR"), Some(""));
    assert_eq!(strip_admin_prefix("/$emulatorx"), None);
    assert_eq!(strip_admin_prefix("/q/messages"), None);
}

#[test]
fn batch_bodies_are_validated() {
    let ok = parse_batch(
        br#"[{"Body":"This is the first message","UserProperties":{"Priority":"Low"}},
                 {"Body":"This is the second message","BrokerProperties":{"Label":"M2","TimeToLiveTimeSpan":"0.00:00:40"}}]"#,
    )
    .unwrap();
    assert_eq!(ok.len(), 2);
    assert!(parse_batch(b"{}").is_err());
    assert!(parse_batch(b"[]").is_err());
    assert!(parse_batch(br#"[{"Body":1}]"#).is_err());
    assert!(parse_batch(br#"[{"UserProperties":{"bad name":1}}]"#).is_err());
    assert!(parse_batch(br#"[{"UserProperties":{"p":[1]}}]"#).is_err());
}
