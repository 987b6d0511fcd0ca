//! `--store dynamodb://TABLE`: the DynamoDB store's cost. At each concurrency, in rounds, three ways to write
//! the same business item:
//!
//! * `inbox`: a new message through the inbox (its `TransactWriteItems` carries the marker and the item);
//! * `same_tx`: the item alone in a `TransactWriteItems` of its own (the same transaction without the marker);
//! * `put`: the item alone in a `PutItem`;
//! * `marker_tx`: the item and a copy of a real marker (new key, same attributes and size, the marker's
//!   condition) in a `TransactWriteItems` sent with the SDK directly: what DynamoDB charges for the marker,
//!   without the inbox's pipeline, so that `inbox/marker_tx` is the pipeline's own share of the gap;
//! * `pair_same_table`, `pair_two_tables`: the item and a second plain item of its size (no condition, no
//!   index entry) in one `TransactWriteItems`, the second in the business table or in the inbox's table:
//!   what the service charges for any second item, against which `marker_tx` shows what the marker's own
//!   condition, index entry and size add.
//!
//! With `--batch B` above 1, each round also runs two batch lines, in messages per second:
//!
//! * `inbox_batchB`: B new messages through
//!   [`InboxProcessor::process_batch`](txinbox_core::InboxProcessor::process_batch), the store's batch mode
//!   ([`WorkerOptions::batch_commit`](txinbox_core::WorkerOptions::batch_commit)): one `TransactWriteItems`
//!   with B markers and B business items;
//! * `same_tx_batchB`: the B business items alone in one `TransactWriteItems`.
//!
//! `inbox_batchB/same_tx` sets the batched inbox against the per-message transaction a consumer without the
//! inbox would send; `inbox_batchB/same_tx_batchB` against the same batch without the markers.
//!
//! The figures are medians over the rounds; the target is inbox / same_tx >= 0.80. It also prints the write
//! units each way costs on the service by DynamoDB's rules (a transactional write costs two units per KB of
//! each item, a standard write one; the marker's `by_consumer` index entry one more), from the items' sizes.
//! It makes a fresh table (`TABLE-<random>`) and a business table beside it, and deletes both at the end.
//! With `--dynamodb-single-table` the business items go into the inbox's own table instead (keyed `pk`, as
//! in a single-table design), and both pair lines then put their two items in that one table.

use std::sync::Arc;

use aws_sdk_dynamodb::types::{AttributeValue, Put, TransactWriteItem};
use aws_sdk_dynamodb::Client;
use txinbox_core::{ConsumerName, HandlerError, IdentityPolicy, Inbox, Message, Raw};
use txinbox_dynamodb::{DynamoOptions, DynamoStore, DynamoTx};
use txinbox_lab::lab::LabError;
use txinbox_testkit::NoopDelivery;

use crate::fixture::{message, CONSUMER};
use crate::rate::{measure, median_rate, per_message, Rate};
use crate::BenchArgs;

fn usage(e: impl std::fmt::Display) -> LabError {
    LabError::Usage(e.to_string())
}

/// Where the business items go: their table and its key attribute (`id` in a table of their own, `pk` in
/// the inbox's table with `--dynamodb-single-table`).
#[derive(Clone)]
struct Business {
    table: String,
    key: &'static str,
}

impl Business {
    /// The business item every way writes: about the size of a follow-up task.
    fn item(&self, id: &str) -> Put {
        Put::builder()
            .table_name(&self.table)
            .item(self.key, AttributeValue::S(format!("t#{id}")))
            .item("opportunity", AttributeValue::S("o-123456".into()))
            .item("meeting", AttributeValue::S("m-123456".into()))
            .item(
                "title",
                AttributeValue::S("Follow up the meeting of the opportunity".into()),
            )
            .build()
            .expect("a put with a table and an item")
    }
}

async fn business_table(client: &Client, name: &str) -> Result<(), LabError> {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    client
        .create_table()
        .table_name(name)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name("id")
                .attribute_type(ScalarAttributeType::S)
                .build()
                .map_err(usage)?,
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name("id")
                .key_type(KeyType::Hash)
                .build()
                .map_err(usage)?,
        )
        .send()
        .await
        .map_err(|e| usage(txinbox_dynamodb::aws_sdk_dynamodb::error::DisplayErrorContext(e)))?;
    Ok(())
}

/// One round's figures.
#[derive(Clone, Copy)]
struct Round {
    inbox: Rate,
    same_tx: Rate,
    put: Rate,
    marker_tx: Rate,
    pair_same_table: Rate,
    pair_two_tables: Rate,
    /// `inbox_batchB` and `same_tx_batchB`, in messages per second (with `--batch` above 1).
    batch: Option<(Rate, Rate)>,
}

/// The most messages a batch line holds: two actions each (the marker and the business item) within
/// DynamoDB's 100 actions per transaction.
const MAX_BATCH: usize = 50;

/// The business item and a second plain item of its size in one `TransactWriteItems`, the second in
/// `second`'s table.
async fn pair_tx(cl: &Client, tasks: &Business, second: &Business, id: &str) -> Result<(), String> {
    cl.transact_write_items()
        .transact_items(
            TransactWriteItem::builder()
                .put(second.item(&format!("{id}-2")))
                .build(),
        )
        .transact_items(TransactWriteItem::builder().put(tasks.item(id)).build())
        .client_request_token(uuid::Uuid::new_v4().to_string())
        .send()
        .await
        .map(|_| ())
        .map_err(sdk_error)
}

/// An SDK error with its whole chain, as a measurement's error.
fn sdk_error<E: std::error::Error + 'static, R: std::fmt::Debug>(
    e: aws_sdk_dynamodb::error::SdkError<E, R>,
) -> String {
    aws_sdk_dynamodb::error::DisplayErrorContext(e).to_string()
}

/// Write units per message by DynamoDB's rules: a transactional write 2 per KB (rounded up) of each item, a
/// standard write 1, an index entry 1 per KB of what it projects.
fn units(bytes: usize, transactional: bool) -> usize {
    bytes.div_ceil(1024) * if transactional { 2 } else { 1 }
}

/// Runs the DynamoDB lines.
pub async fn run(args: &BenchArgs, table: &str) -> Result<(), LabError> {
    let client = match &args.dynamodb_endpoint {
        Some(e) => txinbox_dynamodb::emulator_client(e),
        None => {
            let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
                .http_client(txinbox_dynamodb::http_client())
                .load()
                .await;
            Client::new(&conf)
        }
    };
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    let inbox_table = format!("{table}-{}", &suffix[..12]);
    DynamoStore::create_table(&client, &inbox_table)
        .await
        .map_err(usage)?;
    let tasks = if args.dynamodb_single_table {
        Business {
            table: inbox_table.clone(),
            key: txinbox_dynamodb::layout::PK,
        }
    } else {
        let tasks = format!("{inbox_table}-tasks");
        business_table(&client, &tasks).await?;
        Business {
            table: tasks,
            key: "id",
        }
    };
    let result = lines(args, &client, &inbox_table, &tasks).await;
    let _ = client.delete_table().table_name(&inbox_table).send().await;
    if tasks.table != inbox_table {
        let _ = client.delete_table().table_name(&tasks.table).send().await;
    }
    result
}

async fn lines(
    args: &BenchArgs,
    client: &Client,
    table: &str,
    tasks: &Business,
) -> Result<(), LabError> {
    if args.batch > MAX_BATCH {
        return Err(usage(format!(
            "--batch {} is over {MAX_BATCH} on DynamoDB: a batch's marker and business item per message must fit \
             DynamoDB's 100 actions per transaction",
            args.batch
        )));
    }
    let store = DynamoStore::open(client.clone(), table, DynamoOptions::default())
        .await
        .map_err(usage)?;
    let consumer = ConsumerName::new(CONSUMER).map_err(usage)?;
    let t = tasks.clone();
    let inbox = Arc::new(Inbox::new(store, IdentityPolicy::new(consumer)).bind(
        move |tx: DynamoTx, msg: Message<Raw>| {
            let t = t.clone();
            async move {
                tx.put(t.item(&format!("in-{}", msg.identity.message_id)))?;
                Ok::<_, HandlerError>(())
            }
        },
    ));
    println!(
        "# txinbox bench: DynamoDB (table {table}, business items in {}), {}s per figure, median of {} rounds, messages per second; target inbox/same_tx >= 0.80",
        if tasks.table == table { "the inbox's table" } else { "a table of their own" },
        args.seconds, args.rounds
    );
    // One message first: its marker is the template of `marker_tx`.
    let warm = inbox.process_one(NoopDelivery(message("warm-up", 0))).await;
    if warm.label() != "applied" {
        return Err(usage(format!(
            "the warm-up message was not applied: {warm}"
        )));
    }
    let template = Arc::new(sample_marker(client, table).await?);
    for &c in &args.concurrency {
        let mut rounds = Vec::with_capacity(args.rounds);
        for round in 0..args.rounds {
            let tag = format!("{c}-{round}");
            let ib = inbox.clone();
            let tg = tag.clone();
            let run_inbox = || {
                measure(c, args.seconds, move |th, i| {
                    let ib = ib.clone();
                    let m = message(&format!("in-{tg}-{th}-{i}"), i);
                    Box::pin(async move {
                        let o = ib.process_one(NoopDelivery(m)).await;
                        if o.label() == "applied" {
                            Ok(())
                        } else {
                            Err(format!("unexpected outcome {o}, wanted applied"))
                        }
                    })
                })
            };
            let (cl, tk, tg) = (client.clone(), tasks.clone(), tag.clone());
            let run_same_tx = || {
                measure(c, args.seconds, move |th, i| {
                    let (cl, tk) = (cl.clone(), tk.clone());
                    let id = format!("tx-{tg}-{th}-{i}");
                    Box::pin(async move {
                        cl.transact_write_items()
                            .transact_items(TransactWriteItem::builder().put(tk.item(&id)).build())
                            .client_request_token(uuid::Uuid::new_v4().to_string())
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(sdk_error)
                    })
                })
            };
            let (cl, tk, tg) = (client.clone(), tasks.clone(), tag.clone());
            let run_put = || {
                measure(c, args.seconds, move |th, i| {
                    let (cl, tk) = (cl.clone(), tk.clone());
                    let id = format!("put-{tg}-{th}-{i}");
                    let p = tk.item(&id);
                    Box::pin(async move {
                        cl.put_item()
                            .table_name(p.table_name())
                            .set_item(Some(p.item().clone()))
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(sdk_error)
                    })
                })
            };
            let (cl, tk, tg, tb, tpl) = (
                client.clone(),
                tasks.clone(),
                tag.clone(),
                table.to_owned(),
                template.clone(),
            );
            let run_marker_tx = || {
                measure(c, args.seconds, move |th, i| {
                    let (cl, tk, tb) = (cl.clone(), tk.clone(), tb.clone());
                    let id = format!("mk-{tg}-{th}-{i}");
                    let mut marker = (*tpl).clone();
                    let pk = format!("m#bench#{id}");
                    marker.insert(
                        "gsi1pk".into(),
                        AttributeValue::S(txinbox_dynamodb::layout::markers_of(
                            CONSUMER,
                            txinbox_dynamodb::layout::marker_shard(&pk),
                        )),
                    );
                    marker.insert("pk".into(), AttributeValue::S(pk));
                    marker.insert("gsi1sk".into(), AttributeValue::S(format!("2026#{id}")));
                    Box::pin(async move {
                        let put = Put::builder()
                            .table_name(tb)
                            .set_item(Some(marker))
                            .condition_expression("attribute_not_exists(pk) OR expires_at < :now")
                            .expression_attribute_values(
                                ":now",
                                AttributeValue::N(chrono::Utc::now().timestamp().to_string()),
                            )
                            .return_values_on_condition_check_failure(
                                aws_sdk_dynamodb::types::ReturnValuesOnConditionCheckFailure::AllOld,
                            )
                            .build()
                            .map_err(|e| e.to_string())?;
                        cl.transact_write_items()
                            .transact_items(TransactWriteItem::builder().put(put).build())
                            .transact_items(TransactWriteItem::builder().put(tk.item(&id)).build())
                            .client_request_token(uuid::Uuid::new_v4().to_string())
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(sdk_error)
                    })
                })
            };
            // The second item of a pair: in the business items' table, or in the inbox's (keyed as it is).
            let in_inbox_table = Business {
                table: table.to_owned(),
                key: txinbox_dynamodb::layout::PK,
            };
            let (cl, tk, tg) = (client.clone(), tasks.clone(), tag.clone());
            let run_pair = |two_tables: bool| {
                let (cl, tk, tg) = (cl.clone(), tk.clone(), tg.clone());
                let second = if two_tables {
                    in_inbox_table.clone()
                } else {
                    tk.clone()
                };
                measure(c, args.seconds, move |th, i| {
                    let (cl, tk, second) = (cl.clone(), tk.clone(), second.clone());
                    let id = format!("pr{}-{tg}-{th}-{i}", u8::from(two_tables));
                    Box::pin(async move { pair_tx(&cl, &tk, &second, &id).await })
                })
            };
            // The two figures of the target back to back, in alternating order from round to round.
            let (inbox_rate, same_tx) = if round % 2 == 0 {
                let a = run_inbox().await?;
                (a, run_same_tx().await?)
            } else {
                let b = run_same_tx().await?;
                (run_inbox().await?, b)
            };
            let b = args.batch;
            let ib = inbox.clone();
            let tg = tag.clone();
            let run_inbox_batch = || {
                measure(c, args.seconds, move |th, i| {
                    let ib = ib.clone();
                    let batch: Vec<NoopDelivery> = (0..b)
                        .map(|k| NoopDelivery(message(&format!("ib-{tg}-{th}-{i}-{k}"), i)))
                        .collect();
                    Box::pin(async move {
                        let out = ib
                            .process_batch(batch, &txinbox_core::CancellationToken::new())
                            .await;
                        match out.iter().find(|o| o.label() != "applied") {
                            None => Ok(()),
                            Some(o) => {
                                Err(format!("unexpected outcome {o} in a batch, wanted applied"))
                            }
                        }
                    })
                })
            };
            let (cl, tk, tg) = (client.clone(), tasks.clone(), tag.clone());
            let run_same_tx_batch = || {
                measure(c, args.seconds, move |th, i| {
                    let (cl, tk) = (cl.clone(), tk.clone());
                    let items: Vec<TransactWriteItem> = (0..b)
                        .map(|k| {
                            TransactWriteItem::builder()
                                .put(tk.item(&format!("txb-{tg}-{th}-{i}-{k}")))
                                .build()
                        })
                        .collect();
                    Box::pin(async move {
                        cl.transact_write_items()
                            .set_transact_items(Some(items))
                            .client_request_token(uuid::Uuid::new_v4().to_string())
                            .send()
                            .await
                            .map(|_| ())
                            .map_err(sdk_error)
                    })
                })
            };
            // The two batch lines back to back too, in the same alternating order.
            let batch = if b < 2 {
                None
            } else if round % 2 == 0 {
                let a = per_message(run_inbox_batch().await?, b);
                Some((a, per_message(run_same_tx_batch().await?, b)))
            } else {
                let s = per_message(run_same_tx_batch().await?, b);
                Some((per_message(run_inbox_batch().await?, b), s))
            };
            rounds.push(Round {
                inbox: inbox_rate,
                same_tx,
                put: run_put().await?,
                marker_tx: run_marker_tx().await?,
                pair_same_table: run_pair(false).await?,
                pair_two_tables: run_pair(true).await?,
                batch,
            });
        }
        let inbox_rate = median_rate(&rounds, |r| r.inbox);
        let same_tx = median_rate(&rounds, |r| r.same_tx);
        let put = median_rate(&rounds, |r| r.put);
        let marker_tx = median_rate(&rounds, |r| r.marker_tx);
        let pair_same = median_rate(&rounds, |r| r.pair_same_table);
        let pair_two = median_rate(&rounds, |r| r.pair_two_tables);
        let per_round: Vec<String> = rounds
            .iter()
            .map(|r| format!("{:.2}", r.inbox.per_sec / r.same_tx.per_sec))
            .collect();
        println!(
            "c={c} put={:.0} same_tx={:.0} inbox={:.0} inbox/same_tx={:.2} inbox/put={:.2} inbox/same_tx_per_round=[{}]",
            put.per_sec,
            same_tx.per_sec,
            inbox_rate.per_sec,
            inbox_rate.per_sec / same_tx.per_sec,
            inbox_rate.per_sec / put.per_sec,
            per_round.join(" ")
        );
        println!(
            "#   c={c} marker_tx={:.0} marker_tx/same_tx={:.2} inbox/marker_tx={:.2} (DynamoDB's share of the gap, then the pipeline's)",
            marker_tx.per_sec,
            marker_tx.per_sec / same_tx.per_sec,
            inbox_rate.per_sec / marker_tx.per_sec,
        );
        println!(
            "#   c={c} pair_same_table={:.0} pair_two_tables={:.0} pair_same_table/same_tx={:.2} pair_two_tables/same_tx={:.2} marker_tx/pair_two_tables={:.2} (any second item, then what the marker adds to one)",
            pair_same.per_sec,
            pair_two.per_sec,
            pair_same.per_sec / same_tx.per_sec,
            pair_two.per_sec / same_tx.per_sec,
            marker_tx.per_sec / pair_two.per_sec,
        );
        if rounds.iter().all(|r| r.batch.is_some()) && !rounds.is_empty() {
            let b = args.batch;
            let inbox_batch = median_rate(&rounds, |r| r.batch.expect("checked").0);
            let same_batch = median_rate(&rounds, |r| r.batch.expect("checked").1);
            let per_round: Vec<String> = rounds
                .iter()
                .map(|r| {
                    let (ib, sb) = r.batch.expect("checked");
                    format!(
                        "{:.2}/{:.2}",
                        ib.per_sec / r.same_tx.per_sec,
                        ib.per_sec / sb.per_sec
                    )
                })
                .collect();
            println!(
                "#   c={c} inbox_batch{b}={:.0} same_tx_batch{b}={:.0} inbox_batch{b}/same_tx={:.2} inbox_batch{b}/same_tx_batch{b}={:.2} per_round=[{}] (the store's batch mode: {b} messages a transaction)",
                inbox_batch.per_sec,
                same_batch.per_sec,
                inbox_batch.per_sec / same_tx.per_sec,
                inbox_batch.per_sec / same_batch.per_sec,
                per_round.join(" ")
            );
        }
    }
    // What each way costs on the service, from the sizes of the items this run wrote.
    let business = txinbox_dynamodb::layout::item_size(tasks.item("in-32-0-0-1000").item());
    let marker = txinbox_dynamodb::layout::item_size(&template);
    println!(
        "# write units per message on DynamoDB (its rules, these items: business item {business} B, marker {marker} B): put={} same_tx={} inbox={} (marker {} + its by_consumer entry {} + business item {})",
        units(business, false),
        units(business, true),
        units(marker, true) + units(marker, false) + units(business, true),
        units(marker, true),
        units(marker, false),
        units(business, true),
    );
    Ok(())
}

/// One marker the run wrote, as stored: the first found in the consumer's marker partitions.
async fn sample_marker(
    client: &Client,
    table: &str,
) -> Result<txinbox_dynamodb::layout::Item, LabError> {
    for partition in txinbox_dynamodb::layout::marker_partitions(CONSUMER) {
        let out = client
            .query()
            .table_name(table)
            .index_name(txinbox_dynamodb::layout::BY_CONSUMER)
            .key_condition_expression("gsi1pk = :p")
            .expression_attribute_values(":p", AttributeValue::S(partition))
            .limit(1)
            .send()
            .await
            .map_err(|e| usage(aws_sdk_dynamodb::error::DisplayErrorContext(e)))?;
        if let Some(item) = out.items().first() {
            return Ok(item.clone());
        }
    }
    Err(usage("no marker found after the warm-up message"))
}
