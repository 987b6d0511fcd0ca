//! The handler API on SQLite and PostgreSQL: a typed `Message<T>` handler bound with `Inbox::bind` (the
//! transaction's type inferred), a body that does not deserialize, the business key computed from the typed
//! body, the first application's result reference handed back to a duplicate, how errors raised with `?` are
//! classified (a database error by the store, anything else retried), and a transaction kept past the
//! handler's return. Each case checks the outcome, the broker, the inbox rows and the business rows.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use txinbox::broker::Delivery;
use txinbox::mem::{MemoryDelivery, MemoryQueue, OutgoingMessage, QueueState};
use txinbox::sqlx;
use txinbox::{
    ConsumerName, Handled, Handler, HandlerError, IdentityPolicy, Inbox, InboxProcessor, Message,
    Outcome, Retry, Store,
};
use txinbox_e2e::{pg_store, sqlite_store};

const CONSUMER: &str = "order-intake";

/// The typed body of the test's messages.
#[derive(Clone, Debug, serde::Deserialize)]
struct PlaceOrder {
    order: String,
    customer: String,
    amount: i64,
}

/// The business key of placing an order: one order is placed once, whatever message asks for it.
fn order_key(o: &PlaceOrder) -> Option<String> {
    Some(format!("place_order:{}", o.order))
}

/// Message `id` asking to place `order`.
fn place(id: &str, order: &str) -> OutgoingMessage {
    let body = serde_json::json!({ "order": order, "customer": "acme", "amount": 100 });
    OutgoingMessage::new(body.to_string()).producer_id(id)
}

/// Message `id` with a raw body.
fn raw(id: &str, body: &[u8]) -> OutgoingMessage {
    OutgoingMessage::new(body.to_vec()).producer_id(id)
}

fn deliver(q: &MemoryQueue, m: OutgoingMessage) -> MemoryDelivery {
    q.send(m);
    q.receive_now(1).pop().expect("the message just sent")
}

/// A call elsewhere than the database (an HTTP client, say) that fails.
fn call_crm() -> Result<(), std::io::Error> {
    Err(std::io::Error::other("CRM API timed out"))
}

#[test]
fn question_mark_leaves_the_classification_to_the_store() {
    let e: HandlerError = std::io::Error::other("boom").into();
    assert_eq!(e.retry_kind(), Retry::Unclassified);
    assert!(!e.is_retryable(), "only an explicit retry says it can help");
    assert!(HandlerError::retry("busy").is_retryable());
    assert!(HandlerError::retry_after("busy", Duration::from_secs(1)).is_retryable());
    assert!(!HandlerError::permanent("closed").is_retryable());
    assert_eq!(HandlerError::permanent("closed").retry_kind(), Retry::No);
}

macro_rules! typed_handler_tests {
    ($backend:ident, $db:ty, $store:expr) => {
        mod $backend {
            use super::*;

            type Db = $db;

            /// A fresh store with the business table (one row per order, the order id unique) and the inbox.
            async fn setup() -> (Store<Db>, Inbox<Store<Db>>) {
                let store: Store<Db> = $store;
                sqlx::query(
                    "CREATE TABLE orders (order_id TEXT NOT NULL UNIQUE, customer TEXT NOT NULL, amount BIGINT NOT NULL, message_id TEXT NOT NULL)",
                )
                .execute(store.pool())
                .await
                .unwrap();
                let inbox = Inbox::new(
                    store.clone(),
                    IdentityPolicy::new(ConsumerName::new(CONSUMER).unwrap()),
                )
                .retry_backoff(Duration::from_secs(5));
                (store, inbox)
            }

            /// The typed handler: places the order through the inbox's transaction (whose type is inferred)
            /// and returns a reference to it; counts its calls.
            fn place_order(
                inbox: Inbox<Store<Db>>,
                calls: Arc<AtomicUsize>,
            ) -> InboxProcessor<Store<Db>, PlaceOrder, impl Handler<Store<Db>, PlaceOrder>> {
                inbox.bind(move |tx, msg: Message<PlaceOrder>| {
                    calls.fetch_add(1, Ordering::SeqCst);
                    async move {
                        sqlx::query(
                            "INSERT INTO orders (order_id, customer, amount, message_id) VALUES ($1, $2, $3, $4)",
                        )
                        .bind(msg.body.order.clone())
                        .bind(msg.body.customer.clone())
                        .bind(msg.body.amount)
                        .bind(msg.id().to_owned())
                        .execute(&tx)
                        .await?;
                        Ok(Handled::reference(format!("order:{}", msg.body.order)))
                    }
                })
            }

            /// The business rows: (order, customer, amount, message id).
            async fn orders(store: &Store<Db>) -> Vec<(String, String, i64, String)> {
                sqlx::query_as(
                    "SELECT order_id, customer, amount, message_id FROM orders ORDER BY order_id",
                )
                .fetch_all(store.pool())
                .await
                .unwrap()
            }

            /// The inbox rows of message `id`.
            async fn markers(store: &Store<Db>, id: &str) -> i64 {
                sqlx::query_scalar(
                    "SELECT count(*) FROM txinbox_inbox WHERE consumer_name = $1 AND message_id = $2",
                )
                .bind(CONSUMER)
                .bind(id.to_owned())
                .fetch_one(store.pool())
                .await
                .unwrap()
            }

            /// The result reference stored with message `id`'s marker.
            async fn stored_reference(store: &Store<Db>, id: &str) -> Option<String> {
                sqlx::query_scalar(
                    "SELECT result_reference FROM txinbox_inbox WHERE consumer_name = $1 AND message_id = $2",
                )
                .bind(CONSUMER)
                .bind(id.to_owned())
                .fetch_one(store.pool())
                .await
                .unwrap()
            }

            /// Evidence rows of `kind`.
            async fn rejections(store: &Store<Db>, kind: &str) -> i64 {
                sqlx::query_scalar("SELECT count(*) FROM txinbox_rejections WHERE kind = $1")
                    .bind(kind.to_owned())
                    .fetch_one(store.pool())
                    .await
                    .unwrap()
            }

            fn placed(order: &str, id: &str) -> (String, String, i64, String) {
                (order.into(), "acme".into(), 100, id.into())
            }

            #[tokio::test]
            async fn a_typed_handler_applies_once_and_a_duplicate_gets_the_first_reference() {
                let (store, inbox) = setup().await;
                let calls = Arc::new(AtomicUsize::new(0));
                let p = place_order(inbox, calls.clone()).business_key(order_key);
                let q = MemoryQueue::default();

                assert_eq!(
                    p.process_one(deliver(&q, place("evt-1", "A-1"))).await,
                    Outcome::Applied {
                        result_reference: Some("order:A-1".into())
                    }
                );
                let again = p.process_one(deliver(&q, place("evt-1", "A-1"))).await;
                assert!(
                    matches!(
                        &again,
                        Outcome::Duplicate { result_reference: Some(r) } if r == "order:A-1"
                    ),
                    "{again:?}"
                );

                assert_eq!(calls.load(Ordering::SeqCst), 1, "the duplicate never reached the handler");
                assert_eq!(q.state(), QueueState::default(), "both deliveries acked");
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 1);
                assert_eq!(stored_reference(&store, "evt-1").await.as_deref(), Some("order:A-1"));
                assert_eq!(orders(&store).await, vec![placed("A-1", "evt-1")]);
            }

            #[tokio::test]
            async fn a_body_that_does_not_deserialize_is_dead_lettered_and_nothing_is_written() {
                let (store, inbox) = setup().await;
                let calls = Arc::new(AtomicUsize::new(0));
                let p = place_order(inbox, calls.clone()).business_key(order_key);
                let q = MemoryQueue::default();
                let bodies: [&[u8]; 4] = [
                    br#"{"order":"A-1","customer":"acme"}"#,
                    br#"{"order":"A-1","customer":"acme","amount":"a hundred"}"#,
                    br#""place order A-1""#,
                    b"{not json",
                ];
                for (i, body) in bodies.iter().enumerate() {
                    let id = format!("evt-bad-{i}");
                    match p.process_one(deliver(&q, raw(&id, body))).await {
                        Outcome::DeadLettered { reason, detail } => {
                            assert_eq!(reason, "invalid_json", "{id}: {detail}");
                            assert!(!detail.is_empty(), "{id}");
                        }
                        other => panic!("{id}: expected a dead-letter, got {other:?}"),
                    }
                }
                let dl = q.dead_letters();
                assert_eq!(dl.len(), bodies.len());
                assert!(dl.iter().all(|(_, why)| why.reason == "invalid_json"), "{dl:?}");
                assert_eq!(
                    q.state(),
                    QueueState {
                        dead_lettered: bodies.len(),
                        ..QueueState::default()
                    }
                );
                assert_eq!(calls.load(Ordering::SeqCst), 0, "the handler never ran");
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);
                assert!(orders(&store).await.is_empty());
            }

            #[tokio::test]
            async fn the_typed_business_key_catches_another_message_for_the_same_order() {
                let (store, inbox) = setup().await;
                let calls = Arc::new(AtomicUsize::new(0));
                let p = place_order(inbox, calls.clone()).business_key(order_key);
                let q = MemoryQueue::default();

                assert!(matches!(
                    p.process_one(deliver(&q, place("evt-1", "A-1"))).await,
                    Outcome::Applied { .. }
                ));
                // Another message id asking for the same business action.
                assert_eq!(
                    p.process_one(deliver(&q, place("evt-2", "A-1"))).await,
                    Outcome::BusinessDuplicate {
                        holder_message_id: "evt-1".into(),
                        result_reference: Some("order:A-1".into()),
                    }
                );
                // Another order is another business action.
                assert!(matches!(
                    p.process_one(deliver(&q, place("evt-3", "B-7"))).await,
                    Outcome::Applied { .. }
                ));

                assert_eq!(calls.load(Ordering::SeqCst), 2);
                assert_eq!(q.state(), QueueState::default(), "the business duplicate was acked");
                assert_eq!(rejections(&store, "business_duplicate").await, 1);
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 2);
                assert_eq!(markers(&store, "evt-2").await, 0);
                assert_eq!(
                    orders(&store).await,
                    vec![placed("A-1", "evt-1"), placed("B-7", "evt-3")]
                );
            }

            #[tokio::test]
            async fn a_unique_violation_raised_with_question_mark_is_dead_lettered_as_permanent() {
                let (store, inbox) = setup().await;
                let calls = Arc::new(AtomicUsize::new(0));
                // No business key: the second message for the same order reaches the handler, whose INSERT
                // violates the business table's unique order id.
                let p = place_order(inbox, calls.clone());
                let q = MemoryQueue::default();

                assert!(matches!(
                    p.process_one(deliver(&q, place("evt-1", "A-1"))).await,
                    Outcome::Applied { .. }
                ));
                match p.process_one(deliver(&q, place("evt-2", "A-1"))).await {
                    Outcome::DeadLettered { reason, detail } => {
                        assert_eq!(reason, "handler_permanent", "{detail}");
                        assert!(!detail.is_empty());
                    }
                    other => panic!("expected a permanent failure, got {other:?}"),
                }

                assert_eq!(calls.load(Ordering::SeqCst), 2);
                let dl = q.dead_letters();
                assert_eq!(dl.len(), 1);
                assert_eq!(dl[0].0, place("evt-2", "A-1"), "the dead letter keeps the message");
                assert_eq!(dl[0].1.reason, "handler_permanent");
                assert_eq!(
                    q.state(),
                    QueueState {
                        dead_lettered: 1,
                        ..QueueState::default()
                    }
                );
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 1);
                assert_eq!(markers(&store, "evt-2").await, 0, "its marker rolled back");
                assert_eq!(orders(&store).await, vec![placed("A-1", "evt-1")]);
            }

            #[tokio::test]
            async fn another_error_raised_with_question_mark_is_retried() {
                let (store, inbox) = setup().await;
                let calls = Arc::new(AtomicUsize::new(0));
                // Places the order, then the CRM call fails: the order rolls back with the marker.
                let flaky = inbox.clone().bind(|tx, msg: Message<PlaceOrder>| async move {
                    sqlx::query(
                        "INSERT INTO orders (order_id, customer, amount, message_id) VALUES ($1, $2, $3, $4)",
                    )
                    .bind(msg.body.order.clone())
                    .bind(msg.body.customer.clone())
                    .bind(msg.body.amount)
                    .bind(msg.id().to_owned())
                    .execute(&tx)
                    .await?;
                    call_crm()?;
                    Ok(())
                });
                let q = MemoryQueue::default();

                match flaky.process_one(deliver(&q, place("evt-1", "A-1"))).await {
                    Outcome::Retry { reason } => assert!(reason.contains("CRM API timed out"), "{reason}"),
                    other => panic!("expected a retry, got {other:?}"),
                }
                assert_eq!(
                    q.state(),
                    QueueState {
                        delayed: 1,
                        ..QueueState::default()
                    },
                    "released with the inbox's backoff"
                );
                assert!(q.dead_letters().is_empty());
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 0);
                assert!(orders(&store).await.is_empty(), "rolled back");

                // Redelivered after the backoff: the working handler applies it once.
                q.advance(Duration::from_secs(6));
                let d = q.receive_now(1).pop().expect("redelivered");
                assert_eq!(d.message().delivery_count, 2);
                let p = place_order(inbox, calls.clone()).business_key(order_key);
                assert!(matches!(p.process_one(d).await, Outcome::Applied { .. }));
                assert_eq!(q.state(), QueueState::default());
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 1);
                assert_eq!(orders(&store).await, vec![placed("A-1", "evt-1")]);
            }

            #[tokio::test]
            async fn a_tx_kept_past_the_handler_gets_an_error() {
                let (store, inbox) = setup().await;
                let kept = Arc::new(Mutex::new(None));
                let slot = kept.clone();
                let p = inbox
                    .bind(move |tx, msg: Message<PlaceOrder>| {
                        // Keeps a clone of the transaction past its return.
                        *slot.lock().unwrap() = Some(tx.clone());
                        async move {
                            sqlx::query(
                                "INSERT INTO orders (order_id, customer, amount, message_id) VALUES ($1, $2, $3, $4)",
                            )
                            .bind(msg.body.order.clone())
                            .bind(msg.body.customer.clone())
                            .bind(msg.body.amount)
                            .bind(msg.id().to_owned())
                            .execute(&tx)
                            .await?;
                            Ok(())
                        }
                    })
                    .business_key(order_key);
                let q = MemoryQueue::default();
                assert!(matches!(
                    p.process_one(deliver(&q, place("evt-1", "A-1"))).await,
                    Outcome::Applied { .. }
                ));

                let tx = kept.lock().unwrap().take().expect("the handler kept its Tx");
                let late = sqlx::query(
                    "INSERT INTO orders (order_id, customer, amount, message_id) VALUES ('late', 'acme', 1, 'evt-1')",
                )
                .execute(&tx)
                .await;
                match late {
                    Err(sqlx::Error::Protocol(e)) => {
                        assert!(e.contains("transaction has ended"), "{e}")
                    }
                    other => panic!("a write through a kept Tx must fail, got {other:?}"),
                }
                let read: Result<i64, _> = sqlx::query_scalar("SELECT count(*) FROM orders")
                    .fetch_one(&tx)
                    .await;
                assert!(read.is_err(), "a read through a kept Tx must fail too: {read:?}");
                drop(tx);

                // Nothing written late; the connection went back (the pool answers).
                assert_eq!(q.state(), QueueState::default());
                assert_eq!(store.inbox_rows(CONSUMER).await.unwrap(), 1);
                assert_eq!(orders(&store).await, vec![placed("A-1", "evt-1")]);
            }
        }
    };
}

typed_handler_tests!(sqlite, sqlx::Sqlite, sqlite_store().await);
typed_handler_tests!(postgres, sqlx::Postgres, pg_store(4).await);
