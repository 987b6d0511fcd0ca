//! Unit tests of the broker's rules, driven by a hand-set clock.

use super::address::parse_entity;
use super::*;
use crate::wire::TimeToLive;

fn message(id: &str) -> IncomingMessage {
    IncomingMessage {
        body: Bytes::from_static(b"hello"),
        content_type: None,
        sender: SenderProperties {
            message_id: Some(id.into()),
            ..SenderProperties::default()
        },
        properties: Vec::new(),
    }
}

fn lock_of(outcome: ReceiveOutcome) -> (String, String) {
    let ReceiveOutcome::Delivered(d) = outcome else {
        panic!("expected a message")
    };
    let path = d.lock_path.expect("peek-lock has a lock path");
    let mut parts = path.rsplit('/');
    let token = parts.next().unwrap().to_string();
    let seq = parts.next().unwrap().to_string();
    (seq, token)
}

#[test]
fn lapsed_locks_raise_the_delivery_count_and_dead_letter() {
    let mut broker = Broker::new(vec![(
        "q".into(),
        QueueProperties::default()
            .lock_duration(Duration::from_secs(1))
            .max_delivery_count(2),
    )]);
    let t0 = Instant::now();
    broker.send("q", vec![message("m")], t0).unwrap();
    let (seq, token) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
    // Hidden while locked.
    assert!(
        matches!(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap(), ReceiveOutcome::Empty { next_event: Some(at) } if at == t0 + Duration::from_secs(1))
    );
    let t1 = t0 + Duration::from_secs(1);
    assert_eq!(
        broker.lock_operation("q", &seq, &token, LockOperation::Complete, t1),
        Err(DataError::LockNotFound)
    );
    let ReceiveOutcome::Delivered(d) = broker.receive("q", ReceiveMode::PeekLock, t1).unwrap()
    else {
        panic!("expected redelivery")
    };
    assert!(d.broker_properties.contains("\"DeliveryCount\":2"));
    let t2 = t1 + Duration::from_secs(1);
    let state = broker.queue_state("q", t2).unwrap();
    assert_eq!(state.active_message_count, 0);
    assert_eq!(state.dead_letter_message_count, 1);
    assert_eq!(
        state.dead_letter_messages[0].dead_letter_reason.as_deref(),
        Some("MaxDeliveryCountExceeded")
    );
}

#[test]
fn ttl_is_capped_and_expired_messages_are_dead_lettered_when_enabled() {
    let mut broker = Broker::new(vec![(
        "q".into(),
        QueueProperties::default()
            .default_message_time_to_live(Duration::from_secs(5))
            .dead_lettering_on_message_expiration(true),
    )]);
    let t0 = Instant::now();
    let mut long = message("long");
    long.sender.time_to_live = Some(TimeToLive::Finite(Duration::from_secs(3600)));
    broker.send("q", vec![long], t0).unwrap();
    let state = broker.queue_state("q", t0).unwrap();
    assert_eq!(state.messages[0].time_to_live_seconds, Some(5.0));
    let state = broker
        .queue_state("q", t0 + Duration::from_secs(5))
        .unwrap();
    assert_eq!(
        state.dead_letter_messages[0].dead_letter_reason.as_deref(),
        Some("TTLExpiredException")
    );
}

/// The queue looks at its messages only when something may be due; every way a lock or an
/// expiry comes into being must make it look in time.
#[test]
fn renewed_locks_hold_and_abandoned_messages_still_expire_on_time() {
    let mut broker = Broker::new(vec![(
        "q".into(),
        QueueProperties::default()
            .lock_duration(Duration::from_secs(2))
            .default_message_time_to_live(Duration::from_secs(10))
            .dead_lettering_on_message_expiration(true),
    )]);
    let t0 = Instant::now();
    let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
    broker
        .send("q", vec![message("a"), message("b")], t0)
        .unwrap();
    let (seq_a, token_a) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
    let (seq_b, token_b) = lock_of(broker.receive("q", ReceiveMode::PeekLock, at(1.0)).unwrap());
    broker
        .lock_operation("q", &seq_a, &token_a, LockOperation::Abandon, at(1.0))
        .unwrap();
    broker
        .lock_operation("q", &seq_b, &token_b, LockOperation::Renew, at(2.0))
        .unwrap();
    // b's first lock would have ended at 3 s; the renewal holds it to 4 s.
    let state = broker.queue_state("q", at(3.5)).unwrap();
    assert_eq!(state.locked_message_count, 1);
    broker
        .lock_operation("q", &seq_b, &token_b, LockOperation::Complete, at(3.5))
        .unwrap();
    // a, abandoned and never touched again, expires at 10 s.
    let state = broker.queue_state("q", at(9.9)).unwrap();
    assert_eq!(
        (
            state.available_message_count,
            state.dead_letter_message_count
        ),
        (1, 0)
    );
    let state = broker.queue_state("q", at(10.0)).unwrap();
    assert_eq!(
        (state.active_message_count, state.dead_letter_message_count),
        (0, 1)
    );
    // A lock named by MessageId instead of SequenceNumber is still found.
    let (_, token) = lock_of(
        broker
            .receive("q/$deadletterqueue", ReceiveMode::PeekLock, at(10.0))
            .unwrap(),
    );
    broker
        .lock_operation(
            "q/$deadletterqueue",
            "a",
            &token,
            LockOperation::Complete,
            at(10.0),
        )
        .unwrap();
    assert_eq!(
        broker
            .queue_state("q", at(10.0))
            .unwrap()
            .dead_letter_message_count,
        0
    );
}

/// A lock may outlast its message's time to live; once abandoned, the message expires at its own time.
#[test]
fn a_message_abandoned_under_a_long_lock_expires_on_time() {
    let mut broker = Broker::new(vec![(
        "q".into(),
        QueueProperties::default()
            .lock_duration(Duration::from_secs(5))
            .dead_lettering_on_message_expiration(true),
    )]);
    let t0 = Instant::now();
    let at = |secs: f64| t0 + Duration::from_secs_f64(secs);
    let with_ttl = |id: &str, secs: f64| {
        let mut m = message(id);
        m.sender.time_to_live = Some(TimeToLive::Finite(Duration::from_secs_f64(secs)));
        m
    };
    broker
        .send("q", vec![with_ttl("a", 4.5), with_ttl("b", 1.0)], t0)
        .unwrap();
    let (seq, token) = lock_of(broker.receive("q", ReceiveMode::PeekLock, t0).unwrap());
    // b expires; a is locked to 5 s, past its expiry.
    let state = broker.queue_state("q", at(2.0)).unwrap();
    assert_eq!(
        (state.locked_message_count, state.dead_letter_message_count),
        (1, 1)
    );
    broker
        .lock_operation("q", &seq, &token, LockOperation::Abandon, at(3.0))
        .unwrap();
    let state = broker.queue_state("q", at(4.6)).unwrap();
    assert_eq!(
        (state.active_message_count, state.dead_letter_message_count),
        (0, 2)
    );
}

#[test]
fn entity_paths_split_the_dead_letter_segment() {
    let a = parse_entity("Orders/$DeadLetterQueue").unwrap();
    assert_eq!(
        (a.queue_key.as_str(), a.sub),
        ("orders", SubQueue::DeadLetter)
    );
    let a = parse_entity("a/b/c").unwrap();
    assert_eq!((a.queue_key.as_str(), a.sub), ("a/b/c", SubQueue::Active));
    assert!(parse_entity("/").is_err());
    assert!(validate_queue_path("t/subscriptions/s").is_ok());
    assert!(validate_queue_path("a/messages").is_err());
    assert!(validate_queue_path("a//b").is_err());
    assert!(validate_queue_path("$emulator").is_err());
}
