use std::time::Duration;

use super::*;
use crate::pipeline::identity::ce;

/// A message that is no binary-mode CloudEvent (no `ce-id`), with a `ce-tenantid` attribute if `tenant`.
fn plain(body: &str, tenant: Option<&str>) -> ReceivedMessage {
    let mut m = ReceivedMessage::new(body.as_bytes().to_vec());
    if let Some(t) = tenant {
        m.attributes.insert(ce::TENANT_ID.into(), t.into());
    }
    m
}

/// A binary-mode CloudEvent (`ce-id`, `ce-source`) of `tenant`.
fn msg(body: &str, tenant: Option<&str>) -> ReceivedMessage {
    let mut m = plain(body, tenant);
    m.attributes.insert(ce::ID.into(), "e1".into());
    m.attributes.insert(ce::SOURCE.into(), "crm".into());
    m
}

#[test]
fn the_tenant_comes_from_the_attribute_or_a_structured_cloudevent() {
    let r = ShardRouter::tenant();
    assert_eq!(r.key(&msg("{}", Some("acme"))).as_deref(), Some("acme"));
    let structured =
        r#" {"specversion":"1.0","id":"e1","source":"crm","tenantid":"globex","data":{}}"#;
    assert_eq!(r.key(&plain(structured, None)).as_deref(), Some("globex"));
    // As in the identity: a binary-mode event (ce-id) takes the attribute, whatever its body holds; a
    // structured one its body, whatever the attributes say.
    assert_eq!(
        r.key(&msg(structured, Some("acme"))).as_deref(),
        Some("acme")
    );
    assert_eq!(
        r.key(&plain(structured, Some("acme"))).as_deref(),
        Some("globex")
    );
    // A ce-tenantid attribute on a message that is no CloudEvent (identified by its producer id): no tenant.
    assert_eq!(r.key(&plain("{}", Some("acme"))), None);
    // A body with specversion and tenantid but no id is no structured CloudEvent the identity accepts.
    assert_eq!(
        r.key(&plain(r#"{"specversion":"1.0","tenantid":"globex"}"#, None)),
        None
    );
    // A JSON body that is not a CloudEvent names no tenant, nor does a body that is not JSON.
    assert_eq!(r.key(&plain(r#"{"tenantid":"globex"}"#, None)), None);
    assert_eq!(r.key(&plain("tenantid=globex", None)), None);
    assert_eq!(r.key(&plain("{not json", None)), None);
}

#[test]
fn an_unavailable_shard_s_release_delay_doubles_up_to_its_cap() {
    let o = ShardOptions::new()
        .unavailable_backoff(Duration::from_secs(5))
        .unavailable_backoff_max(Duration::from_secs(300));
    let delays: Vec<u64> = (1..=9).map(|n| o.unavailable_delay(n).as_secs()).collect();
    assert_eq!(delays, [5, 10, 20, 40, 80, 160, 300, 300, 300]);
    assert_eq!(o.unavailable_delay(0).as_secs(), 5);
    assert_eq!(o.unavailable_delay(u32::MAX).as_secs(), 300);
    // Ten deliveries ride out the sum of the first nine delays.
    let rides_out: u64 = delays.iter().sum();
    assert_eq!(rides_out, 1_215);
}

#[test]
fn every_key_goes_to_its_claimant_and_the_rest_to_the_rest() {
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", ()).claims(["acme", "globex"]),
            Shard::new("us-1", ()).claims(["initech"]).rest(),
        ],
    )
    .unwrap();
    assert_eq!(shards.names(), ["eu-1", "us-1"]);
    assert_eq!(shards.shard_of(&msg("{}", Some("globex"))), Ok("eu-1"));
    assert_eq!(shards.shard_of(&msg("{}", Some("initech"))), Ok("us-1"));
    assert_eq!(shards.shard_of(&msg("{}", Some("umbrella"))), Ok("us-1"));
    assert_eq!(shards.shard_of(&msg("{}", None)), Ok("us-1"));
    let strict = Shards::new(
        ShardRouter::tenant(),
        [Shard::new("eu-1", ()).claims(["acme"])],
    )
    .unwrap();
    let why = strict.shard_of(&msg("{}", Some("umbrella"))).unwrap_err();
    assert!(
        why.contains(r#""umbrella" is claimed by no shard"#),
        "{why}"
    );
    let why = strict.shard_of(&msg("{}", None)).unwrap_err();
    assert!(why.contains("has no tenant"), "{why}");
    let by_region = Shards::new(
        ShardRouter::by("region", |m| m.attribute("region").map(str::to_owned)),
        [Shard::new("eu", ()).claims(["eu"]).rest()],
    )
    .unwrap();
    let mut m = msg("{}", Some("acme"));
    m.attributes.insert("region".into(), "eu".into());
    assert_eq!(by_region.shard_of(&m), Ok("eu"));
}

/// A store the inbox must never reach: every call is counted and fails.
#[derive(Clone, Default)]
struct Untouched(Arc<std::sync::atomic::AtomicU32>);

#[derive(Debug, thiserror::Error)]
#[error("the store was reached")]
struct Reached;

impl Untouched {
    fn reached<T>(&self) -> Result<T, Reached> {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Err(Reached)
    }
}

impl crate::store::InboxStore for Untouched {
    type Tx = ();
    type Error = Reached;
    fn name(&self) -> &'static str {
        "untouched"
    }
    async fn begin(&self) -> Result<(), Reached> {
        self.reached()
    }
    async fn insert_marker(
        &self,
        _: &(),
        _: &crate::store::MarkerRow<'_>,
    ) -> Result<crate::store::MarkerInsert, Reached> {
        self.reached()
    }
    async fn record_result(
        &self,
        _: &(),
        _: &crate::Identity,
        _: Option<&str>,
        _: &[crate::effects::NewEffect<'_>],
    ) -> Result<(), Reached> {
        self.reached()
    }
    async fn commit(&self, _: ()) -> Result<crate::store::Commit, Reached> {
        self.reached()
    }
    async fn rollback(&self, _: (), _: bool) -> Result<(), Reached> {
        self.reached()
    }
    async fn record_rejection(&self, _: &crate::store::Rejection<'_>) -> Result<(), Reached> {
        self.reached()
    }
    fn is_transient(_: &Reached) -> bool {
        false
    }
}

/// Two structured CloudEvents over `limit` bytes: one of a tenant a shard claims, one of a tenant none does.
fn oversized(q: &crate::broker::mem::MemoryQueue, limit: usize) {
    for (id, tenant) in [("e1", "acme"), ("e2", "umbrella")] {
        let body = format!(
            r#"{{"specversion":"1.0","id":"{id}","source":"crm","tenantid":"{tenant}","data":"{}"}}"#,
            "x".repeat(limit)
        );
        q.send(crate::broker::mem::OutgoingMessage::new(body));
    }
}

/// A body over the inbox's `max_payload_bytes` is refused before the router reads it (a structured
/// CloudEvent's tenant is in its JSON: a hostile body would be parsed in full first), with the outcome a
/// worker on one store gives it: dead-lettered `payload_too_large`, the store never reached. One delivery at
/// a time and in batches.
#[tokio::test]
async fn an_oversized_body_is_refused_before_the_router_reads_it() {
    use std::sync::atomic::{AtomicU32, Ordering};

    use crate::broker::mem::{MemoryQueue, QueueOptions};
    use crate::{
        ConsumerName, IdentityPolicy, Inbox, InputRules, Message, OutcomeKind, Worker,
        WorkerOptions,
    };

    let limit = 1024;
    let queue = || {
        MemoryQueue::new(QueueOptions {
            wait: Duration::from_millis(10),
            ..QueueOptions::default()
        })
    };
    let reached = Untouched::default();
    let base = Inbox::new(
        reached.clone(),
        IdentityPolicy::new(ConsumerName::new("shards-limit").unwrap()),
    )
    .input_rules(InputRules::default().max_payload_bytes(limit))
    .bind(|_tx, _m: Message<serde_json::Value>| async move { Ok(()) });

    // One store: what an oversized message gets.
    let single = queue();
    oversized(&single, limit);
    let report = Worker::new(single.receiver(), base.clone())
        .run_until_idle()
        .await;
    assert_eq!(report.count(OutcomeKind::DeadLettered), 2, "{report}");
    let dead_letters = |q: &MemoryQueue| {
        let mut d: Vec<_> = q.dead_letters().into_iter().map(|(_, d)| d).collect();
        d.sort_by(|a, b| a.detail.cmp(&b.detail));
        d
    };
    let expected = dead_letters(&single);
    assert!(
        expected.iter().all(|d| d.reason == "payload_too_large"),
        "{expected:?}"
    );

    for batch in [1, 4] {
        let reads = Arc::new(AtomicU32::new(0));
        let counted = reads.clone();
        let shards = Shards::new(
            ShardRouter::by("tenant", move |m| {
                counted.fetch_add(1, Ordering::SeqCst);
                ShardRouter::tenant().key(m)
            }),
            [
                Shard::new("eu-1", base.on_store(reached.clone())).claims(["acme"]),
                Shard::new("us-1", base.on_store(reached.clone())).claims(["initech"]),
            ],
        )
        .unwrap();
        let sharded = queue();
        oversized(&sharded, limit);
        let report = Worker::new(sharded.receiver(), shards)
            .options(WorkerOptions::default().batch_commit(batch))
            .run_until_idle()
            .await;
        assert_eq!(
            reads.load(Ordering::SeqCst),
            0,
            "the router read an oversized message (batch {batch})"
        );
        assert_eq!(
            report.count(OutcomeKind::DeadLettered),
            2,
            "batch {batch}: {report}"
        );
        assert_eq!(
            dead_letters(&sharded),
            expected,
            "batch {batch}: as on one store"
        );
    }
    assert_eq!(reached.0.load(Ordering::SeqCst), 0, "the store was reached");
}

/// Acknowledges every delivery.
struct Acks;

impl<D: crate::Delivery> crate::Processor<D> for Acks {
    fn consumer(&self) -> &str {
        "shards-panic"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> crate::Outcome {
        let _ = delivery.ack().await;
        crate::Outcome::Applied {
            result_reference: None,
        }
    }
}

/// A router function that panics on a message (the user's code on a hostile body) dead-letters that message
/// `no_shard`, saying why; the other deliveries of its batch go on, rather than the whole batch being left
/// unsettled until its visibility timeout.
#[tokio::test]
async fn a_router_that_panics_dead_letters_that_message_alone() {
    use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
    use crate::{OutcomeKind, Worker, WorkerOptions};

    for batch in [1, 4] {
        let shards = Shards::new(
            ShardRouter::by("region", |m| {
                assert!(m.body != b"boom", "a router function panicked");
                m.attribute("region").map(str::to_owned)
            }),
            [Shard::new("eu", Acks).claims(["eu"]).rest()],
        )
        .unwrap();
        let q = MemoryQueue::new(QueueOptions {
            wait: Duration::from_millis(10),
            visibility_timeout: Duration::from_secs(300),
            ..QueueOptions::default()
        });
        q.send(OutgoingMessage::new("boom").producer_id("p1"));
        q.send(OutgoingMessage::new("fine").producer_id("p2"));
        let report = Worker::new(q.receiver(), shards)
            .options(WorkerOptions::default().batch_commit(batch))
            .run_until_idle()
            .await;
        assert_eq!(
            report.count(OutcomeKind::Applied),
            1,
            "batch {batch}: {report}"
        );
        assert_eq!(
            report.count(OutcomeKind::DeadLettered),
            1,
            "batch {batch}: {report}"
        );
        let dead = q.dead_letters();
        assert_eq!(dead.len(), 1);
        assert_eq!(dead[0].1.reason, NO_SHARD);
        assert!(
            dead[0].1.detail.contains("panicked") && dead[0].1.detail.contains("region"),
            "{:?}",
            dead[0].1
        );
        assert_eq!(
            q.state().in_flight,
            0,
            "batch {batch}: nothing left unsettled"
        );
    }
}

/// Readiness on shards stays ready while one shard answers, however long another takes to fail: a shard whose
/// host drops packets (its check never answers) shows as `degraded shard b: no answer ...`, and the `shards`
/// line passes on shard a's answer alone, without waiting out shard b's probe timeout (longer here than the
/// readiness check timeout, which would fail the line, and with it readiness, for the whole worker).
#[tokio::test(start_paused = true)]
async fn readiness_stays_ready_while_one_shard_answers_and_another_never_does() {
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("a", ())
                .claims(["acme"])
                .check(|| async { Ok::<(), String>(()) }),
            Shard::new("b", ())
                .claims(["globex"])
                .check(std::future::pending::<Result<(), String>>),
        ],
    )
    .unwrap()
    .options(ShardOptions::new().probe_timeout(Duration::from_secs(5)));
    let health = shards.health(Health::new().check_timeout(Duration::from_secs(1)));
    let ready = health.readiness().await;
    let body = ready.to_string();
    assert!(body.contains("ok shard a"), "{body}");
    assert!(body.contains("degraded shard b: no answer"), "{body}");
    assert!(body.contains("ok shards"), "{body}");
    assert!(
        ready
            .checks
            .iter()
            .all(|c| c.ok || !c.required || c.name == "worker"),
        "{body}"
    );
    // Every shard silent: the `shards` line fails.
    let silent = Shards::new(
        ShardRouter::tenant(),
        [Shard::new("b", ())
            .claims(["globex"])
            .check(std::future::pending::<Result<(), String>>)],
    )
    .unwrap()
    .options(ShardOptions::new().probe_timeout(Duration::from_millis(500)));
    let body = silent
        .health(Health::new().check_timeout(Duration::from_secs(1)))
        .readiness()
        .await
        .to_string();
    assert!(
        body.contains("fail shards: every shard is unavailable"),
        "{body}"
    );
}

/// A claimed tenant that no message's tenant can match as written is refused when the shards are built (and so
/// at start from the settings file), with one line naming the shard and the claim: an empty one, one with
/// whitespace around it (`"acme "` would leave `acme`'s messages to the rest or to the dead-letter queue), one
/// with a control character or longer than the inbox lets a tenant be.
#[test]
fn a_claim_no_tenant_can_match_is_refused_with_one_line() {
    let long = "t".repeat(513);
    for (claim, says) in [
        ("", "is empty"),
        ("  ", "is empty"),
        ("acme ", "whitespace"),
        ("\tacme", "control character"),
        ("ac\0me", "control character"),
        (long.as_str(), "longer"),
    ] {
        let e = Shards::new(
            ShardRouter::tenant(),
            [
                Shard::new("eu-1", ()).claims(["globex"]),
                Shard::new("eu-2", ()).claims(["initech", claim]),
            ],
        )
        .unwrap_err();
        assert!(
            matches!(&e, ShardConfigError::InvalidTenant { shard, key, .. } if shard == "eu-2" && key == claim),
            "{claim:?}: {e:?}"
        );
        let line = e.to_string();
        assert!(line.contains(says) && !line.contains('\n'), "{line}");
    }
    // What a tenant may be: kept as written, inner spaces and any letters included.
    let ok = Shards::new(
        ShardRouter::tenant(),
        [Shard::new("eu-1", ()).claims(["acme corp", "Ünïcode", &"t".repeat(512)])],
    )
    .unwrap();
    assert_eq!(ok.shard_of(&msg("{}", Some("acme corp"))), Ok("eu-1"));
    let e = crate::settings::WorkerSettings::from_toml_str(
        "[store.shards.eu-1]\nurl = \"postgres://crm@db/crm\"\ntenants = [\"acme \"]\n",
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains(r#"shard "eu-1" claims tenant "acme ""#), "{e}");
}

/// Two shards claiming one tenant written in two Unicode forms (NFC and NFD), or in two cases, are refused with
/// one line naming both shards: a producer writing the other form would land on the other shard. One shard may
/// list both forms (they go to the same place); tenants that only look alike stay apart.
#[test]
fn claims_equal_after_nfc_or_case_folding_on_two_shards_are_refused() {
    let nfc = "Soci\u{e9}t\u{e9}"; // Société, precomposed
    let nfd = "Socie\u{301}te\u{301}"; // Société, e + combining acute
    assert_ne!(nfc, nfd);
    for (first, second, says) in [
        (nfc, nfd, "Unicode"),
        ("Acme", "acme", "case"),
        ("STRASSE", "stra\u{df}e", "case"),
        ("SOCI\u{c9}T\u{c9}", nfd, "case"),
    ] {
        let e = Shards::new(
            ShardRouter::tenant(),
            [
                Shard::new("eu-1", ()).claims(["globex", first]),
                Shard::new("eu-2", ()).claims([second]),
            ],
        )
        .unwrap_err();
        let line = e.to_string();
        assert!(
            line.contains("\"eu-1\"") && line.contains("\"eu-2\"") && line.contains(says),
            "{first:?} {second:?}: {line}"
        );
        assert!(!line.contains('\n'), "{line}");
        // The settings file (and check-infra) refuse it too.
        let toml = format!(
            "[store.shards.eu-1]\nurl = \"postgres://crm@db1/crm\"\ntenants = [\"{first}\"]\n[store.shards.eu-2]\nurl = \"postgres://crm@db2/crm\"\ntenants = [\"{second}\"]\n"
        );
        let e = crate::settings::WorkerSettings::from_toml_str(&toml)
            .unwrap_err()
            .to_string();
        assert!(e.contains("eu-1") && e.contains("eu-2"), "{e}");
    }
    // Both forms on one shard: every copy lands there, whichever form the producer writes.
    let one = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", ()).claims([nfc, nfd, "Acme", "acme"]),
            Shard::new("eu-2", ()).claims(["globex"]),
        ],
    )
    .unwrap();
    assert_eq!(one.shard_of(&msg("{}", Some(nfd))), Ok("eu-1"));
    assert_eq!(one.shard_of(&msg("{}", Some("Acme"))), Ok("eu-1"));
    // Still matched exactly: a form no shard lists is claimed by none.
    assert!(one.shard_of(&msg("{}", Some("ACME"))).is_err());
    // Tenants that only look alike (Latin and Cyrillic a) are different tenants.
    Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", ()).claims(["acme"]),
            Shard::new("eu-2", ()).claims(["\u{430}cme"]),
        ],
    )
    .unwrap();
}

/// A tenant a shard claims, written in another form (another case, another Unicode form), is not given to the
/// shard that takes the rest, where it would have its data and markers apart from the tenant's: it is
/// dead-lettered `no_shard`, the detail naming the shard and the claim it meets.
#[test]
fn a_claimed_tenant_in_another_form_never_goes_to_the_rest() {
    let nfc = "Soci\u{e9}t\u{e9}";
    let nfd = "Socie\u{301}te\u{301}";
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", ()).claims(["acme", nfc]),
            Shard::new("eu-2", ()).claims(["globex"]).rest(),
        ],
    )
    .unwrap();
    assert_eq!(shards.shard_of(&msg("{}", Some("acme"))), Ok("eu-1"));
    assert_eq!(shards.shard_of(&msg("{}", Some(nfc))), Ok("eu-1"));
    assert_eq!(shards.shard_of(&msg("{}", Some("initech"))), Ok("eu-2"));
    assert_eq!(shards.shard_of(&msg("{}", None)), Ok("eu-2"));
    for other in ["ACME", "Acme", nfd, "SOCI\u{c9}T\u{c9}"] {
        let why = shards.shard_of(&msg("{}", Some(other))).unwrap_err();
        assert!(
            why.contains("\"eu-1\"") && why.contains("another form"),
            "{other:?}: {why}"
        );
    }
}

/// Two probes of one shard that overlap (the periodic one and the one after a retry): the answer of the probe
/// that began last is the shard's state, whichever answers last. A probe begun while the shard was down and
/// timing out after a newer probe found it back does not mark it down again (its deliveries would be released,
/// each with its growing delay, until the next probe).
#[tokio::test]
async fn an_older_probe_answering_last_does_not_undo_a_newer_one() {
    use std::collections::VecDeque;
    use tokio::sync::oneshot;

    type Answer = oneshot::Receiver<Result<(), String>>;
    for older_says_up in [false, true] {
        let answers: Arc<Mutex<VecDeque<Answer>>> = Arc::default();
        let (older_tx, older_rx) = oneshot::channel();
        let (newer_tx, newer_rx) = oneshot::channel();
        lock(&answers).extend([older_rx, newer_rx]);
        let queue = answers.clone();
        let check = move || {
            let next = lock(&queue).pop_front().expect("one answer per probe");
            async move { next.await.unwrap_or_else(|_| Err("no answer".into())) }
        };
        let w = Watch {
            name: "b".into(),
            check: Some(Arc::new(check)),
            down: Mutex::new((!older_says_up).then(|| "down before".to_owned())),
            probing: AtomicBool::new(false),
            begun: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
        };
        let timeout = Duration::from_secs(3600);
        let mut older = Box::pin(probe::probe_one(&w, timeout, None));
        let mut newer = Box::pin(probe::probe_one(&w, timeout, None));
        assert!(futures::poll!(older.as_mut()).is_pending());
        assert!(futures::poll!(newer.as_mut()).is_pending());
        let (older_says, newer_says) = if older_says_up {
            (Ok(()), Err("connection refused".to_owned()))
        } else {
            (Err("no answer within 2000 ms".to_owned()), Ok(()))
        };
        newer_tx.send(newer_says.clone()).unwrap();
        newer.await;
        older_tx.send(older_says).unwrap();
        older.await;
        assert_eq!(
            lock(&w.down).clone(),
            newer_says.err(),
            "the newer probe's answer stands (older says up: {older_says_up})"
        );
    }
}

/// A message whose key no shard takes is dead-lettered with a detail that quotes the key, up to 128 bytes and
/// its length: a sender's key can be as long as the broker lets an attribute be (256 KiB on SQS), and the
/// detail is logged too, once per delivery. A router's panic message is bounded the same way.
#[test]
fn a_long_unclaimed_key_is_quoted_in_part() {
    let shards = Shards::new(
        ShardRouter::tenant(),
        [Shard::new("eu-1", ()).claims(["acme"])],
    )
    .unwrap();
    let long = format!("é{}", "x".repeat(200_000));
    let why = shards.shard_of(&msg("{}", Some(&long))).unwrap_err();
    assert!(why.len() < 400, "{} bytes", why.len());
    assert!(
        why.contains("\"éxxx") && why.contains("(200002 bytes)"),
        "{why}"
    );
    let why = shards.shard_of(&msg("{}", Some("umbrella"))).unwrap_err();
    assert!(
        why.contains(r#""umbrella" is claimed by no shard"#),
        "{why}"
    );
    let panicky = Shards::new(
        ShardRouter::by("region", |m| panic!("{}", "y".repeat(m.body.len()))),
        [Shard::new("eu", ()).claims(["eu"]).rest()],
    )
    .unwrap();
    let why = panicky
        .shard_of(&plain(&"b".repeat(100_000), None))
        .unwrap_err();
    assert!(why.len() < 400 && why.contains("panicked"), "{why}");
}

/// A shard name refused says what a name may be, its length included: a name of 65 letters is refused as one
/// with a space is, and the line says why.
#[test]
fn a_shard_name_refused_for_its_length_says_so() {
    let long = "e".repeat(65);
    let e = Shards::new(
        ShardRouter::tenant(),
        [Shard::new(long.as_str(), ()).rest()],
    )
    .unwrap_err();
    assert_eq!(e, ShardConfigError::InvalidName(long.clone()));
    assert!(e.to_string().contains("1 to 64"), "{e}");
    Shards::new(ShardRouter::tenant(), [Shard::new(&long[..64], ()).rest()]).unwrap();
}

/// A delivery whose release, as Service Bus's over REST, holds its caller for the delay (when `holds`), and
/// records when it was released.
struct Holding {
    msg: ReceivedMessage,
    holds: bool,
    released_at: Arc<Mutex<Option<tokio::time::Instant>>>,
}

impl crate::Delivery for Holding {
    fn message(&self) -> &ReceivedMessage {
        &self.msg
    }
    async fn ack(self) -> Result<(), crate::BrokerError> {
        Ok(())
    }
    async fn release(self, delay: Duration) -> Result<(), crate::BrokerError> {
        tokio::time::sleep(delay).await;
        *lock(&self.released_at) = Some(tokio::time::Instant::now());
        Ok(())
    }
    async fn dead_letter(self, _: crate::DeadLetter) -> Result<(), crate::BrokerError> {
        Ok(())
    }
    fn lease(&self) -> Option<Arc<dyn crate::Lease>> {
        None
    }
    fn release_holds(&self) -> bool {
        self.holds
    }
}

/// On a broker whose release holds its caller for the delay (Service Bus over REST: the lock is kept, then
/// abandoned), a down shard's delivery used to keep its worker slot for the whole delay (10 s), so a shard
/// that was down took the slots of the shards that were up. Its release now waits in the background and the
/// slot is free at once; the release still happens after the delay. A broker whose release returns at once,
/// and a release past MAX_BACKGROUND_RELEASES, are settled in the slot as before.
#[tokio::test(start_paused = true)]
async fn a_down_shard_s_release_that_holds_does_not_hold_the_worker_slot() {
    use crate::Processor;
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", Acks).claims(["acme"]),
            Shard::new("us-1", Acks).claims(["initech"]),
        ],
    )
    .unwrap()
    .options(ShardOptions::new().unavailable_backoff(Duration::from_secs(5)));
    *lock(&shards.inner.watch[0].down) = Some("connection refused".into());
    let delay = Duration::from_secs(5);

    let process = |holds: bool| {
        let shards = shards.clone();
        async move {
            let released_at = Arc::new(Mutex::new(None));
            let d = Holding {
                msg: msg("{}", Some("acme")),
                holds,
                released_at: released_at.clone(),
            };
            let start = tokio::time::Instant::now();
            let outcome = shards.process(d, CancellationToken::new()).await;
            assert!(
                matches!(&outcome, crate::Outcome::Retry { reason } if reason.contains("eu-1")),
                "{outcome:?}"
            );
            (start, start.elapsed(), released_at)
        }
    };

    // A release that holds: the slot is free at once, the release happens after the delay.
    let (start, took, released_at) = process(true).await;
    assert_eq!(took, Duration::ZERO, "the slot waited for the release");
    assert_eq!(*lock(&released_at), None);
    tokio::time::sleep(delay + Duration::from_secs(1)).await;
    assert_eq!(
        *lock(&released_at),
        Some(start + delay),
        "released after its delay"
    );

    // A release that returns at once (SQS, the memory broker) is settled in the slot, as before.
    let (start, took, released_at) = process(false).await;
    assert_eq!(took, delay);
    assert_eq!(*lock(&released_at), Some(start + delay));

    // Past the bound, a release that holds waits in its slot.
    let all = shards
        .inner
        .releasing
        .clone()
        .try_acquire_many_owned(MAX_BACKGROUND_RELEASES as u32)
        .unwrap();
    let (_, took, _) = process(true).await;
    assert_eq!(took, delay, "past the bound the release waits in its slot");
    drop(all);
}

/// Acknowledges every delivery, as consumer `.0`.
struct AcksAs(&'static str);

impl<D: crate::Delivery> crate::Processor<D> for AcksAs {
    fn consumer(&self) -> &str {
        self.0
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> crate::Outcome {
        let _ = delivery.ack().await;
        crate::Outcome::Applied {
            result_reference: None,
        }
    }
}

/// A queue holding one CloudEvent of tenant `acme`.
fn one_message_queue() -> crate::broker::mem::MemoryQueue {
    use crate::broker::mem::{MemoryQueue, OutgoingMessage, QueueOptions};
    let q = MemoryQueue::new(QueueOptions {
        wait: Duration::from_millis(10),
        ..QueueOptions::default()
    });
    q.send(
        OutgoingMessage::new("{}")
            .cloudevent("crm", "e1", "meeting.ended")
            .attribute(ce::TENANT_ID, "acme"),
    );
    q
}

/// Shards whose processors are of two consumers are one worker with two consumer names: its metrics would
/// carry the first's. The worker refuses to start with one line naming both shards and both consumers, and
/// receives nothing.
#[tokio::test]
async fn shards_of_two_consumers_are_refused_when_the_worker_starts() {
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", AcksAs("crm-followup")).claims(["acme"]),
            Shard::new("eu-2", AcksAs("billing")).claims(["globex"]),
        ],
    )
    .unwrap();
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), shards)
        .run_until_idle()
        .await;
    let why = report.gave_up.clone().expect("refused at start");
    for word in ["eu-1", "eu-2", "crm-followup", "billing"] {
        assert!(why.contains(word), "{why}");
    }
    assert!(!why.contains('\n'), "{why}");
    assert_eq!(report.outcomes.values().sum::<u64>(), 0, "{report}");
    assert_eq!(q.state().visible, 1, "nothing was received");
    // One consumer: runs.
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", AcksAs("billing")).claims(["acme"]),
            Shard::new("eu-2", AcksAs("billing")).claims(["globex"]),
        ],
    )
    .unwrap();
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), shards)
        .run_until_idle()
        .await;
    assert!(report.gave_up.is_none(), "{report}");
    assert_eq!(report.count(crate::OutcomeKind::Applied), 1, "{report}");
}

/// Two consumers' shards named alike on one `Health` would give two lines `shard eu-1` that nobody can tell
/// apart: the second set's checks are not added, and its worker refuses to start with one line naming the
/// check.
#[tokio::test]
async fn two_shard_sets_on_one_health_never_give_two_checks_of_one_name() {
    let set = |consumer: &'static str| {
        Shards::new(
            ShardRouter::tenant(),
            [
                Shard::new("eu-1", AcksAs(consumer))
                    .claims(["acme"])
                    .check(|| async { Ok::<(), String>(()) }),
                Shard::new("eu-2", AcksAs(consumer))
                    .claims(["globex"])
                    .check(|| async { Ok::<(), String>(()) }),
            ],
        )
        .unwrap()
    };
    let (crm, billing) = (set("crm-followup"), set("billing"));
    let health = billing.health(crm.health(Health::new()));
    let ready = health.readiness().await;
    let mut names: Vec<&str> = ready.checks.iter().map(|c| c.name.as_str()).collect();
    let all = names.len();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), all, "{ready}");
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), billing)
        .run_until_idle()
        .await;
    let why = report.gave_up.clone().expect("refused at start");
    assert!(why.contains("shard eu-1") && !why.contains('\n'), "{why}");
    assert_eq!(q.state().visible, 1, "nothing was received");
    // The first set's worker runs.
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), crm).run_until_idle().await;
    assert!(report.gave_up.is_none(), "{report}");
}

/// Acknowledges every delivery, as consumer `billing`; says no worker can run it when `.0` says why.
struct MayRefuse(Option<&'static str>);

impl<D: crate::Delivery> crate::Processor<D> for MayRefuse {
    fn consumer(&self) -> &str {
        "billing"
    }
    async fn process(&self, delivery: D, _stop: CancellationToken) -> crate::Outcome {
        let _ = delivery.ack().await;
        crate::Outcome::Applied {
            result_reference: None,
        }
    }
    fn refused(&self) -> Option<String> {
        self.0.map(str::to_owned)
    }
}

/// A shard whose processor refuses to run (the shards of two consumers nested in a shard, a processor of the
/// user's) is not hidden by the shards around it: the worker refuses to start with that processor's line,
/// naming the shard, and receives nothing.
#[tokio::test]
async fn a_shard_whose_processor_refuses_to_run_refuses_the_worker() {
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", MayRefuse(None)).claims(["acme"]),
            Shard::new("eu-2", MayRefuse(Some("put together wrong"))).claims(["globex"]),
        ],
    )
    .unwrap();
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), shards)
        .run_until_idle()
        .await;
    let why = report.gave_up.clone().expect("refused at start");
    assert!(
        why.contains("eu-2") && why.contains("put together wrong") && !why.contains("eu-1"),
        "{why}"
    );
    assert!(!why.contains('\n'), "{why}");
    assert_eq!(q.state().visible, 1, "nothing was received");
    // No shard's processor refuses: runs.
    let shards = Shards::new(
        ShardRouter::tenant(),
        [
            Shard::new("eu-1", MayRefuse(None)).claims(["acme"]),
            Shard::new("eu-2", MayRefuse(None)).claims(["globex"]),
        ],
    )
    .unwrap();
    let q = one_message_queue();
    let report = crate::Worker::new(q.receiver(), shards)
        .run_until_idle()
        .await;
    assert!(report.gave_up.is_none(), "{report}");
    assert_eq!(report.count(crate::OutcomeKind::Applied), 1, "{report}");
}
