use super::*;

#[tokio::test]
async fn redelivers_after_expiry_and_dead_letters_after_max() {
    let q = MemoryQueue::new(QueueOptions {
        max_receive_count: Some(2),
        ..QueueOptions::default()
    });
    q.send(OutgoingMessage::new("a").producer_id("1"));
    let d = q.receive_now(10);
    assert_eq!(d.len(), 1);
    assert!(q.receive_now(10).is_empty(), "invisible while locked");
    drop(d);
    q.advance(Duration::from_secs(31));
    let d = q.receive_now(10);
    assert_eq!(d[0].message().delivery_count, 2);
    drop(d);
    q.advance(Duration::from_secs(31));
    assert!(q.receive_now(10).is_empty());
    assert_eq!(q.state().dead_lettered, 1);
    assert_eq!(q.redrive(10), 1);
    let d = q.receive_now(10).pop().unwrap();
    assert_eq!(d.message().producer_id.as_deref(), Some("1"));
    d.ack().await.unwrap();
    assert_eq!(q.state(), QueueState::default());
}

#[tokio::test]
async fn stale_receipt_is_lock_lost_and_faults_apply() {
    let q = MemoryQueue::default();
    q.send(OutgoingMessage::new("a"));
    let first = q.receive_now(1).pop().unwrap();
    q.advance(Duration::from_secs(31));
    let second = q.receive_now(1).pop().unwrap();
    assert_eq!(
        first.ack().await.unwrap_err().kind(),
        BrokerErrorKind::LockLost
    );
    q.inject_ack_fault(SettleFault::DropResponse);
    assert_eq!(
        second.ack().await.unwrap_err().kind(),
        BrokerErrorKind::OutcomeUnknown
    );
    assert_eq!(
        q.state(),
        QueueState::default(),
        "dropped response: ack applied"
    );
}

#[test]
fn the_lease_reports_the_visibility_timeout() {
    let q = MemoryQueue::new(QueueOptions {
        visibility_timeout: Duration::from_secs(7),
        ..QueueOptions::default()
    });
    q.send(OutgoingMessage::new("a"));
    let d = q.receive_now(1).pop().unwrap();
    assert_eq!(d.lease().unwrap().duration(), Duration::from_secs(7));
}

/// Each call waits at least the round trip (a lower bound: the sleep is the behaviour, not a timing).
#[tokio::test]
async fn every_call_takes_the_round_trip() {
    let rt = Duration::from_millis(10);
    let q = MemoryQueue::new(QueueOptions::default().round_trip(rt));
    q.send(OutgoingMessage::new("a"));
    q.send(OutgoingMessage::new("b"));
    let mut r = q.receiver();
    let t = std::time::Instant::now();
    let mut got = r.receive(2).await.unwrap();
    assert_eq!(got.len(), 2);
    assert!(t.elapsed() >= rt);
    got.pop().unwrap().ack().await.unwrap();
    assert!(t.elapsed() >= 2 * rt);
    let d = got.pop().unwrap();
    d.lease()
        .unwrap()
        .renew(Duration::from_secs(30))
        .await
        .unwrap();
    assert!(t.elapsed() >= 3 * rt);
    d.release(Duration::ZERO).await.unwrap();
    assert!(t.elapsed() >= 4 * rt);
    assert_eq!(q.receive_now(2).len(), 1, "released, the other acked");
}

/// Concurrent waits end in the order of their deadlines, whatever the order they began in, and a wait
/// given up (its future dropped) leaves the others alone.
///
/// Each wait's deadline is its start plus its delay, and the starts are the tasks' first polls: on a loaded
/// machine the thread can be descheduled between two of them for longer than the delays differ (a CI run
/// saw the 40 ms wait start more than 20 ms after the 60 ms one, so it was due later). The order checked is
/// therefore that of the deadlines the waits really had, not that of their delays.
#[tokio::test]
async fn exact_delays_end_in_deadline_order() {
    let ended = Arc::new(Mutex::new(Vec::new()));
    let given_up = tokio::spawn(exact_delay(Duration::from_millis(15)));
    let mut tasks = Vec::new();
    for ms in [60u64, 20, 40] {
        let ended = ended.clone();
        tasks.push(tokio::spawn(async move {
            let t = std::time::Instant::now();
            exact_delay(Duration::from_millis(ms)).await;
            assert!(t.elapsed() >= Duration::from_millis(ms));
            ended
                .lock()
                .unwrap()
                .push((t + Duration::from_millis(ms), ms));
        }));
    }
    given_up.abort();
    for t in tasks {
        t.await.unwrap();
    }
    let ended = ended.lock().unwrap().clone();
    let mut delays: Vec<u64> = ended.iter().map(|(_, ms)| *ms).collect();
    delays.sort_unstable();
    assert_eq!(delays, [20, 40, 60], "every wait ended once: {ended:?}");
    assert!(
        ended.windows(2).all(|w| w[0].0 <= w[1].0),
        "the waits ended out of their deadlines' order: {ended:?}"
    );
}

#[tokio::test]
async fn round_trip_mean_counts_the_waits() {
    let rt = Duration::from_millis(5);
    let q = MemoryQueue::new(QueueOptions::default().round_trip(rt));
    assert_eq!(q.round_trip_mean(), None);
    q.send(OutgoingMessage::new("a"));
    let mut r = q.receiver();
    let d = r.receive(1).await.unwrap().pop().unwrap();
    d.ack().await.unwrap();
    assert!(q.round_trip_mean().unwrap() >= rt);
    let q0 = MemoryQueue::default();
    q0.send(OutgoingMessage::new("b"));
    q0.receiver().receive(1).await.unwrap();
    assert_eq!(q0.round_trip_mean(), None, "no round trip set, none waited");
}

#[tokio::test]
async fn one_group_at_a_time() {
    let q = MemoryQueue::default();
    q.send(OutgoingMessage::new("1").group("g"));
    q.send(OutgoingMessage::new("2").group("g"));
    q.send(OutgoingMessage::new("3").group("h"));
    let got = q.receive_now(10);
    let bodies: Vec<_> = got.iter().map(|d| d.message().body.clone()).collect();
    assert_eq!(bodies, vec![b"1".to_vec(), b"3".to_vec()]);
}

#[tokio::test]
async fn a_frozen_clock_moves_only_when_advanced() {
    let q = MemoryQueue::default();
    q.freeze_clock();
    let t = q.now();
    std::thread::sleep(Duration::from_millis(5));
    assert_eq!(q.now(), t, "the wall clock no longer moves it");
    q.advance(Duration::from_secs(2));
    assert_eq!(q.now(), t + chrono::Duration::seconds(2));
}
