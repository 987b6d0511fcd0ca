//! The store: options, connection, the table check, and the inbox transaction.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, Put, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TimeToLiveSpecification, TransactWriteItem,
};
use aws_sdk_dynamodb::Client;
use chrono::Utc;
use txinbox_core::effects::NewEffect;
use txinbox_core::pipeline::identity::Identity;
use txinbox_core::store::{Commit, ExistingMarker, MarkerInsert, MarkerRow, Rejection};
use txinbox_core::{HandlerError, InboxStore};

use crate::error::call;
use crate::layout::{self as l, b, n, s, Item, Reader};
use crate::tx::{DynamoTx, Pending, PendingMarker};
use crate::DynamoError;

/// The most actions one `TransactWriteItems` call may carry.
pub const MAX_ACTIONS: usize = 100;
/// The most bytes of items one `TransactWriteItems` call may carry.
pub const MAX_TRANSACTION_BYTES: usize = 4 * 1024 * 1024;
/// The largest item DynamoDB stores.
pub const MAX_ITEM_BYTES: usize = 400 * 1024;

/// How the store behaves.
#[derive(Clone, Debug)]
#[non_exhaustive]
#[must_use = "DynamoOptions do nothing until given to a DynamoStore"]
pub struct DynamoOptions {
    /// Check the table (key schema, indexes, TTL) when the store opens (default true).
    pub check_table: bool,
    /// Attempts of one commit on throttling, transaction conflicts and lost answers (default 5).
    pub commit_attempts: u32,
    /// First backoff between two attempts, doubled each time, with jitter (default 25 ms).
    pub backoff: Duration,
    /// How long evidence items are kept before the TTL deletes them (default 90 days).
    pub rejections_keep: Duration,
    /// How long done and compensated effects are kept before the TTL deletes them (default 7 days).
    pub effects_keep: Duration,
}

impl Default for DynamoOptions {
    fn default() -> Self {
        Self {
            check_table: true,
            commit_attempts: 5,
            backoff: Duration::from_millis(25),
            rejections_keep: Duration::from_secs(90 * 24 * 3600),
            effects_keep: Duration::from_secs(7 * 24 * 3600),
        }
    }
}

impl DynamoOptions {
    /// Whether to check the table when the store opens.
    pub fn check_table(mut self, check: bool) -> Self {
        self.check_table = check;
        self
    }
    /// Attempts of one commit (at least 1).
    pub fn commit_attempts(mut self, n: u32) -> Self {
        self.commit_attempts = n.max(1);
        self
    }
    /// First backoff between two commit attempts.
    pub fn backoff(mut self, d: Duration) -> Self {
        self.backoff = d;
        self
    }
    /// How long evidence items are kept.
    pub fn rejections_keep(mut self, d: Duration) -> Self {
        self.rejections_keep = d;
        self
    }
    /// How long done effects are kept.
    pub fn effects_keep(mut self, d: Duration) -> Self {
        self.effects_keep = d;
        self
    }
}

/// The inbox on one DynamoDB table. Cheap to clone.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) client: Client,
    pub(crate) table: Arc<str>,
    pub(crate) options: Arc<DynamoOptions>,
}

impl std::fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DynamoStore")
            .field("table", &self.table)
            .field("options", &self.options)
            .finish()
    }
}

/// The table name of a `dynamodb://TABLE` URL.
pub fn table_from_url(url: &str) -> Result<String, DynamoError> {
    let table = url
        .strip_prefix("dynamodb://")
        .ok_or_else(|| DynamoError::Url(url.to_owned()))?;
    let ok = (3..=255).contains(&table.len())
        && table
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'-' | b'.'));
    if ok {
        Ok(table.to_owned())
    } else {
        Err(DynamoError::Url(url.to_owned()))
    }
}

/// An HTTPS client on rustls with the *ring* provider (no OpenSSL, no aws-lc), for SDK configs built by hand.
pub fn http_client() -> aws_sdk_dynamodb::config::SharedHttpClient {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// A client for a local emulator (DynamoDB Local, moto) at `endpoint`, with static dummy credentials and
/// region `us-east-1`. Never use it against AWS.
pub fn emulator_client(endpoint: &str) -> Client {
    use aws_sdk_dynamodb::config::{BehaviorVersion, Credentials, Region};
    let conf = aws_sdk_dynamodb::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http_client())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "testing", "testing", None, None, "emulator",
        ))
        .endpoint_url(endpoint)
        .build();
    Client::from_conf(conf)
}

/// A client from the standard AWS configuration chain (environment, shared files, web identity, container
/// and instance metadata; `AWS_ENDPOINT_URL_DYNAMODB` points it at an emulator), on the store's HTTP client.
pub async fn client_from_env() -> Client {
    let conf = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await;
    Client::new(&conf)
}

impl DynamoStore {
    /// Opens `dynamodb://TABLE` with the standard AWS configuration chain (environment, shared files, web
    /// identity, container and instance metadata; `AWS_ENDPOINT_URL_DYNAMODB` points it at an emulator) and
    /// checks the table.
    pub async fn connect(url: &str) -> Result<Self, DynamoError> {
        let table = table_from_url(url)?;
        Self::open(client_from_env().await, table, DynamoOptions::default()).await
    }

    /// Opens `table` through a client of your own (an emulator's, a tuned retry policy) and, unless
    /// [`DynamoOptions::check_table`] is off, checks the table.
    pub async fn open(
        client: Client,
        table: impl Into<String>,
        options: DynamoOptions,
    ) -> Result<Self, DynamoError> {
        let store = Self {
            client,
            table: Arc::from(table.into()),
            options: Arc::new(options),
        };
        if store.options.check_table {
            store.check_table().await?;
        }
        Ok(store)
    }

    /// The table.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Checks that the table exists with the store's layout: hash key `pk` (string) and no range key, the
    /// indexes `by_consumer`, `due` and `by_group` with their keys, and TTL enabled on `expires_at`
    /// (`DescribeTable`, `DescribeTimeToLive`).
    pub async fn check_table(&self) -> Result<(), DynamoError> {
        let table = self.table.to_string();
        let bad = |detail: String| DynamoError::Table {
            table: table.clone(),
            detail,
        };
        let desc = self
            .client
            .describe_table()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| call("DescribeTable", e))?;
        let t = desc
            .table()
            .ok_or_else(|| bad("DescribeTable answered without a table".into()))?;
        let keys: Vec<(&str, &KeyType)> = t
            .key_schema()
            .iter()
            .map(|k| (k.attribute_name(), k.key_type()))
            .collect();
        if keys != [(l::PK, &KeyType::Hash)] {
            return Err(bad(format!(
                "the key schema is {keys:?}; the store needs a hash key \"pk\" (string) and no range key"
            )));
        }
        let string_attr = |name: &str| {
            t.attribute_definitions().iter().any(|a| {
                a.attribute_name() == name && a.attribute_type() == &ScalarAttributeType::S
            })
        };
        if !string_attr(l::PK) {
            return Err(bad("attribute \"pk\" is not a string (S)".into()));
        }
        for (name, hash, range) in l::INDEXES {
            let Some(ix) = t
                .global_secondary_indexes()
                .iter()
                .find(|g| g.index_name() == Some(name))
            else {
                return Err(bad(format!("global secondary index {name:?} is missing ({hash} HASH, {range} RANGE, strings)")));
            };
            let keys: Vec<(&str, &KeyType)> = ix
                .key_schema()
                .iter()
                .map(|k| (k.attribute_name(), k.key_type()))
                .collect();
            if keys != [(hash, &KeyType::Hash), (range, &KeyType::Range)]
                || !string_attr(hash)
                || !string_attr(range)
            {
                return Err(bad(format!(
                    "index {name:?} has keys {keys:?}; the store needs {hash} HASH and {range} RANGE, both strings"
                )));
            }
        }
        let ttl = self
            .client
            .describe_time_to_live()
            .table_name(&*self.table)
            .send()
            .await
            .map_err(|e| call("DescribeTimeToLive", e))?;
        let d = ttl.time_to_live_description();
        let status = d.and_then(|d| d.time_to_live_status()).map(|s| s.as_str());
        let attr = d.and_then(|d| d.attribute_name());
        if !matches!(status, Some("ENABLED") | Some("ENABLING")) || attr != Some(l::EXPIRES_AT) {
            return Err(bad(format!(
                "TTL is {} on {:?}; the store needs it enabled on \"expires_at\" (expired markers are otherwise never deleted)",
                status.unwrap_or("off"),
                attr.unwrap_or("no attribute")
            )));
        }
        Ok(())
    }

    /// Creates `table` with the store's layout (on-demand billing) and enables TTL on `expires_at`: for
    /// tests, emulators and development. Production tables come from your infrastructure code (the
    /// Terraform sample creates one), with point-in-time recovery and encryption.
    pub async fn create_table(client: &Client, table: &str) -> Result<(), DynamoError> {
        let attr = |name: &str| {
            AttributeDefinition::builder()
                .attribute_name(name)
                .attribute_type(ScalarAttributeType::S)
                .build()
        };
        let key = |name: &str, kt: KeyType| {
            KeySchemaElement::builder()
                .attribute_name(name)
                .key_type(kt)
                .build()
        };
        let mut req = client
            .create_table()
            .table_name(table)
            .billing_mode(BillingMode::PayPerRequest)
            .attribute_definitions(attr(l::PK)?)
            .key_schema(key(l::PK, KeyType::Hash)?);
        for (name, hash, range) in l::INDEXES {
            let projection = if name == l::BY_CONSUMER {
                Projection::builder()
                    .projection_type(ProjectionType::All)
                    .build()
            } else {
                Projection::builder()
                    .projection_type(ProjectionType::KeysOnly)
                    .build()
            };
            req = req
                .attribute_definitions(attr(hash)?)
                .attribute_definitions(attr(range)?)
                .global_secondary_indexes(
                    GlobalSecondaryIndex::builder()
                        .index_name(name)
                        .key_schema(key(hash, KeyType::Hash)?)
                        .key_schema(key(range, KeyType::Range)?)
                        .projection(projection)
                        .build()?,
                );
        }
        req.send().await.map_err(|e| call("CreateTable", e))?;
        client
            .update_time_to_live()
            .table_name(table)
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(l::EXPIRES_AT)
                    .build()?,
            )
            .send()
            .await
            .map_err(|e| call("UpdateTimeToLive", e))?;
        Ok(())
    }

    fn now_epoch() -> i64 {
        Utc::now().timestamp()
    }

    /// The conditional put of a marker or a business key item: absent, or present but expired (DynamoDB's
    /// TTL deletes expired items up to days late; the condition keeps the window exact).
    fn absent_or_expired(&self, item: Item) -> Result<TransactWriteItem, DynamoError> {
        let put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(pk) OR expires_at < :now")
            .expression_attribute_values(":now", n(Self::now_epoch()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .build()?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    fn marker_item(m: &PendingMarker, reference: Option<&str>, token: &str) -> Item {
        let id = &m.identity;
        let consumer = id.consumer.as_str();
        let mut item = Item::new();
        item.insert(
            l::PK.into(),
            s(l::marker_pk(consumer, &id.source, &id.message_id)),
        );
        item.insert("kind".into(), s("marker"));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&id.source));
        item.insert("message_id".into(), s(&id.message_id));
        item.insert("id_origin".into(), s(id.origin.as_str()));
        item.insert("payload_hash".into(), s(&m.payload_hash));
        for (k, v) in [
            ("event_type", &id.event_type),
            ("contract_version", &id.contract_version),
            ("tenant_id", &id.tenant_id),
            ("business_key", &id.business_key),
        ] {
            if let Some(v) = v {
                item.insert(k.into(), s(v));
            }
        }
        if let Some(r) = reference {
            item.insert("result_reference".into(), s(r));
        }
        item.insert("received_at".into(), s(l::ts(m.received_at)));
        item.insert("processed_at".into(), s(l::ts(m.processed_at)));
        item.insert("retention_until".into(), s(l::ts(m.retention_until)));
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(m.retention_until)));
        item.insert("delivery_count".into(), n(m.delivery_count));
        item.insert("token".into(), s(token));
        item.insert("gsi1pk".into(), s(l::markers_of(consumer)));
        item.insert(
            "gsi1sk".into(),
            s(format!("{}#{}", l::ts(m.processed_at), id.message_id)),
        );
        item
    }

    fn business_item(m: &PendingMarker, key: &str, reference: Option<&str>) -> Item {
        let id = &m.identity;
        let consumer = id.consumer.as_str();
        let mut item = Item::new();
        item.insert(
            l::PK.into(),
            s(l::business_pk(consumer, id.tenant_id.as_deref(), key)),
        );
        item.insert("kind".into(), s("business_key"));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&id.source));
        item.insert("message_id".into(), s(&id.message_id));
        item.insert("payload_hash".into(), s(&m.payload_hash));
        item.insert("processed_at".into(), s(l::ts(m.processed_at)));
        if let Some(r) = reference {
            item.insert("result_reference".into(), s(r));
        }
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(m.retention_until)));
        item
    }

    fn holder(item: &Item, same_identity: bool) -> Result<ExistingMarker, DynamoError> {
        let r = Reader::new(item);
        Ok(ExistingMarker::new(
            same_identity,
            r.s("message_id")?,
            r.s("payload_hash")?,
            r.time("processed_at")?,
            r.opt_s("result_reference")?,
        ))
    }

    /// One `TransactWriteItems` call of the transaction as it stands, under a fresh token.
    async fn send(
        &self,
        items: Vec<TransactWriteItem>,
        token: &str,
    ) -> Result<
        (),
        aws_sdk_dynamodb::error::SdkError<
            aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
            aws_sdk_dynamodb::config::http::HttpResponse,
        >,
    > {
        self.client
            .transact_write_items()
            .set_transact_items(Some(items))
            .client_request_token(token)
            .send()
            .await
            .map(|_| ())
    }

    async fn pause(&self, attempt: u32) {
        let base = self.options.backoff.saturating_mul(1 << attempt.min(6));
        let jitter = (uuid::Uuid::new_v4().as_u128() % 1000) as u32;
        tokio::time::sleep(base.mul_f64(0.5 + f64::from(jitter) / 2000.0)).await;
    }

    async fn commit_inner(&self, tx: DynamoTx) -> Result<Commit, DynamoError> {
        let (mut pending, actions) = {
            let mut st = tx.lock();
            if st.closed {
                return Err(DynamoError::Closed);
            }
            st.closed = true;
            (
                std::mem::take(&mut st.pending),
                std::mem::take(&mut st.actions),
            )
        };
        if pending.is_empty() {
            // Nothing of the inbox's to write: the handler's actions alone (the pipeline never does this).
            if actions.is_empty() {
                return Ok(Commit::Done);
            }
            let token = uuid::Uuid::new_v4().to_string();
            return self
                .send(actions, &token)
                .await
                .map(|_| Commit::Done)
                .map_err(|e| call("TransactWriteItems", e));
        }
        let share: usize = pending
            .iter()
            .map(|p| 1 + usize::from(p.marker.identity.business_key.is_some()) + p.effects.len())
            .sum();
        if let Err(e) = check_limits(&actions, share) {
            return Ok(Commit::HandlerFailed(HandlerError::permanent(e)));
        }
        let mut tokens: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let token = uuid::Uuid::new_v4().to_string();
            tokens.push(token.clone());
            // What each of the store's items stands for, by its position in the call.
            let mut slots = Vec::with_capacity(share);
            let mut items = Vec::with_capacity(share + actions.len());
            for (i, p) in pending.iter().enumerate() {
                let reference = p.result_reference.as_deref();
                items
                    .push(self.absent_or_expired(Self::marker_item(&p.marker, reference, &token))?);
                slots.push(Slot::Marker);
                if let Some(k) = &p.marker.identity.business_key {
                    items.push(
                        self.absent_or_expired(Self::business_item(&p.marker, k, reference))?,
                    );
                    slots.push(Slot::BusinessKey);
                }
                for (j, e) in p.effects.iter().enumerate() {
                    let put = Put::builder()
                        .table_name(&*self.table)
                        .set_item(Some(e.clone()))
                        .condition_expression("attribute_not_exists(pk)")
                        .build()?;
                    items.push(TransactWriteItem::builder().put(put).build());
                    slots.push(Slot::Effect(i, j));
                }
            }
            let first_action = items.len();
            items.extend(actions.iter().cloned());
            if let Err(e) = check_total_size(&items) {
                return Ok(Commit::HandlerFailed(HandlerError::permanent(e)));
            }
            let err = match self.send(items, &token).await {
                Ok(()) => return Ok(Commit::Done),
                Err(e) => e,
            };
            let last = attempt >= self.options.commit_attempts;
            let reasons = cancellation_reasons(&err);
            let Some(reasons) = reasons else {
                let e = call("TransactWriteItems", err);
                if e.is_transient() && !last {
                    tracing::debug!(error = %e, attempt, "commit: transient error, trying again with a new token");
                    self.pause(attempt).await;
                    continue;
                }
                return Err(e);
            };
            let refused =
                |i: usize| reasons.get(i).and_then(|r| r.code()) == Some("ConditionalCheckFailed");
            // A marker written under one of this commit's own tokens: an earlier attempt committed (all of
            // its items, the transaction being atomic) and its answer was lost.
            let own = slots.iter().enumerate().any(|(i, slot)| {
                *slot == Slot::Marker
                    && refused(i)
                    && reasons[i].item().is_some_and(|item| {
                        Reader::new(item)
                            .opt_s("token")
                            .ok()
                            .flatten()
                            .is_some_and(|t| tokens.contains(&t))
                    })
            });
            if own {
                tracing::info!(
                    attempts = attempt,
                    "commit: found the marker of an earlier attempt of this commit; it committed"
                );
                return Ok(Commit::Done);
            }
            // The first marker or business key item refused, with its holder as it was.
            if let Some((i, slot)) = slots
                .iter()
                .enumerate()
                .find(|(i, slot)| !matches!(slot, Slot::Effect(..)) && refused(*i))
            {
                return Ok(Commit::Conflict(
                    reasons[i]
                        .item()
                        .map(|item| Self::holder(item, *slot == Slot::Marker))
                        .transpose()?,
                ));
            }
            // An effect recorded before under the same key (its message applied before, its marker since
            // expired): kept as it is, as the SQL stores' `ON CONFLICT DO NOTHING` does.
            let taken: HashSet<(usize, usize)> = slots
                .iter()
                .enumerate()
                .filter_map(|(i, slot)| match slot {
                    Slot::Effect(p, e) if refused(i) => Some((*p, *e)),
                    _ => None,
                })
                .collect();
            if !taken.is_empty() {
                for (pi, p) in pending.iter_mut().enumerate() {
                    let mut j = 0;
                    p.effects.retain(|_| {
                        let keep = !taken.contains(&(pi, j));
                        j += 1;
                        keep
                    });
                }
                attempt -= 1;
                continue;
            }
            for (i, r) in reasons.iter().enumerate().skip(first_action) {
                let c = r.code().unwrap_or("None");
                let index = i - first_action;
                let table = action_table(&actions[index]).to_owned();
                let message = r.message().unwrap_or(c).to_owned();
                if c == "ConditionalCheckFailed" {
                    return Ok(Commit::HandlerFailed(HandlerError::from(
                        DynamoError::HandlerCondition {
                            index,
                            table,
                            message,
                        },
                    )));
                }
                if c == "ValidationError" {
                    return Ok(Commit::HandlerFailed(HandlerError::permanent(
                        DynamoError::HandlerInvalid {
                            index,
                            table,
                            message,
                        },
                    )));
                }
            }
            let e = call("TransactWriteItems", err);
            let transient = reasons
                .iter()
                .any(|r| crate::error::transient_code(r.code().unwrap_or("")));
            if transient && !last {
                tracing::debug!(error = %e, attempt, "commit: cancelled by a conflict or throttling, trying again");
                self.pause(attempt).await;
                continue;
            }
            return Err(match e {
                DynamoError::Call {
                    op,
                    message,
                    source,
                    ..
                } => DynamoError::Call {
                    op,
                    transient,
                    message,
                    source,
                },
                other => other,
            });
        }
    }
}

/// What one of the store's items in a `TransactWriteItems` call stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Marker,
    BusinessKey,
    /// The effect `.1` of the delivery `.0`.
    Effect(usize, usize),
}

/// The cancellation reasons of a cancelled transaction, in the order of its actions.
fn cancellation_reasons<R>(
    e: &aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
        R,
    >,
) -> Option<Vec<aws_sdk_dynamodb::types::CancellationReason>> {
    use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
    match e.as_service_error()? {
        TransactWriteItemsError::TransactionCanceledException(c) => {
            Some(c.cancellation_reasons().to_vec())
        }
        _ => None,
    }
}

fn action_table(a: &TransactWriteItem) -> &str {
    if let Some(p) = a.put() {
        return p.table_name();
    }
    if let Some(u) = a.update() {
        return u.table_name();
    }
    if let Some(d) = a.delete() {
        return d.table_name();
    }
    if let Some(c) = a.condition_check() {
        return c.table_name();
    }
    "?"
}

fn action_key(a: &TransactWriteItem) -> Option<String> {
    let (table, key) = if let Some(p) = a.put() {
        // A put's key is inside its item; the store's items carry `pk`, a handler's may use any key: the
        // whole item then stands for it, which can only miss a duplicate, never invent one.
        (p.table_name(), p.item())
    } else if let Some(u) = a.update() {
        (u.table_name(), u.key())
    } else if let Some(d) = a.delete() {
        (d.table_name(), d.key())
    } else if let Some(c) = a.condition_check() {
        (c.table_name(), c.key())
    } else {
        return None;
    };
    let mut parts: Vec<String> = key.iter().map(|(k, v)| format!("{k}={v:?}")).collect();
    parts.sort();
    Some(format!("{table}|{}", parts.join("|")))
}

/// The handler's actions against the service's limits, before anything is sent: a clear permanent error,
/// never a partial write.
fn check_limits(actions: &[TransactWriteItem], store_share: usize) -> Result<(), DynamoError> {
    if actions.len() + store_share > MAX_ACTIONS {
        return Err(DynamoError::Limit(format!(
            "the handler added {} actions and the store needs {store_share} (marker, business key, effects): more than the {MAX_ACTIONS} a TransactWriteItems call may carry",
            actions.len()
        )));
    }
    let mut seen = HashSet::new();
    for (i, a) in actions.iter().enumerate() {
        let Some(k) = action_key(a) else {
            return Err(DynamoError::Limit(format!(
                "the handler's action {i} is empty (no put, update, delete or condition check)"
            )));
        };
        if !seen.insert(k) {
            return Err(DynamoError::Limit(format!(
                "the handler's action {i} targets an item another of its actions targets (table {}): DynamoDB allows one action per item in a transaction",
                action_table(a)
            )));
        }
        if let Some(p) = a.put() {
            let size = l::item_size(p.item());
            if size > MAX_ITEM_BYTES {
                return Err(DynamoError::Limit(format!(
                    "the handler's action {i} puts an item of about {size} bytes (table {}): more than the 400 KB ({MAX_ITEM_BYTES} bytes) DynamoDB stores",
                    p.table_name()
                )));
            }
        }
    }
    Ok(())
}

fn check_total_size(items: &[TransactWriteItem]) -> Result<(), DynamoError> {
    let total: usize = items
        .iter()
        .map(|a| {
            a.put().map(|p| l::item_size(p.item())).unwrap_or(0)
                + a.update()
                    .and_then(|u| u.expression_attribute_values())
                    .map(|v| v.values().map(|x| l::item_size(&single(x))).sum())
                    .unwrap_or(0)
        })
        .sum();
    if total > MAX_TRANSACTION_BYTES {
        return Err(DynamoError::Limit(format!(
            "the transaction carries about {total} bytes of items: more than the 4 MB ({MAX_TRANSACTION_BYTES} bytes) a TransactWriteItems call may carry"
        )));
    }
    Ok(())
}

fn single(v: &aws_sdk_dynamodb::types::AttributeValue) -> Item {
    let mut i = Item::new();
    i.insert(String::new(), v.clone());
    i
}

pub(crate) fn effect_item(e: &NewEffect<'_>, order: usize) -> Item {
    let fx = e.effect;
    let id = l::effect_id(&e.key);
    let created = l::ts(e.created_at);
    let mut item = Item::new();
    item.insert(l::PK.into(), s(l::effect_pk(id)));
    item.insert("kind".into(), s("effect"));
    item.insert("id".into(), n(id));
    item.insert("consumer".into(), s(e.consumer));
    item.insert("message_id".into(), s(e.message_id));
    item.insert("key".into(), s(&e.key));
    item.insert("name".into(), s(&fx.name));
    item.insert("destination".into(), s(&fx.destination));
    item.insert("payload".into(), b(&fx.payload));
    if !fx.metadata.is_empty() {
        item.insert(
            "metadata".into(),
            aws_sdk_dynamodb::types::AttributeValue::M(
                fx.metadata.iter().map(|(k, v)| (k.clone(), s(v))).collect(),
            ),
        );
    }
    item.insert(
        "external_ref".into(),
        s(fx.external_ref.as_deref().unwrap_or(&e.key)),
    );
    item.insert("state".into(), s("pending"));
    item.insert("attempts".into(), n(0));
    item.insert("reconciliations".into(), n(0));
    item.insert("next_at".into(), s(&created));
    item.insert("created_at".into(), s(&created));
    item.insert("updated_at".into(), s(&created));
    item.insert("gsi1pk".into(), s(l::effect_shard(l::shard_of(id))));
    item.insert("gsi1sk".into(), s(format!("{created}#{id}")));
    item.insert("gsi2pk".into(), s(l::due_of(&fx.destination)));
    item.insert("gsi2sk".into(), s(format!("{created}#{id}")));
    if let Some(g) = &fx.group {
        item.insert("group_key".into(), s(g));
        item.insert("gsi3pk".into(), s(l::group_of(e.consumer, g)));
        item.insert("gsi3sk".into(), s(format!("{created}#{order:04}#{id}")));
    }
    item
}

impl InboxStore for DynamoStore {
    type Tx = DynamoTx;
    type Error = DynamoError;

    fn name(&self) -> &'static str {
        "dynamodb"
    }

    async fn begin(&self) -> Result<DynamoTx, DynamoError> {
        Ok(DynamoTx::new(self.client.clone(), self.table.clone()))
    }

    /// Keeps the marker for the commit, without a round trip: the commit's condition decides, and a
    /// conflict comes back from [`InboxStore::commit`] as [`Commit::Conflict`] with the holder as it was. In a
    /// batch (several markers in one transaction), a marker whose item an earlier marker of the same
    /// transaction already writes (the same message twice, or the same business key) is refused here, as a
    /// unique constraint would refuse it: DynamoDB allows one action per item in a transaction.
    async fn insert_marker(
        &self,
        tx: &DynamoTx,
        row: &MarkerRow<'_>,
    ) -> Result<MarkerInsert, DynamoError> {
        let mut st = tx.lock();
        if st.closed {
            return Err(DynamoError::Closed);
        }
        let id = row.identity;
        let consumer = id.consumer.as_str();
        let business = |i: &Identity| {
            i.business_key
                .as_deref()
                .map(|k| l::business_pk(i.consumer.as_str(), i.tenant_id.as_deref(), k))
        };
        let pk = l::marker_pk(consumer, &id.source, &id.message_id);
        let bpk = business(id);
        for p in &st.pending {
            let other = &p.marker.identity;
            let same_identity =
                l::marker_pk(other.consumer.as_str(), &other.source, &other.message_id) == pk;
            if same_identity || (bpk.is_some() && business(other) == bpk) {
                return Ok(MarkerInsert::Conflict(Some(ExistingMarker::new(
                    same_identity,
                    other.message_id.clone(),
                    p.marker.payload_hash.clone(),
                    p.marker.processed_at,
                    p.result_reference.clone(),
                ))));
            }
        }
        st.pending.push(Pending {
            marker: PendingMarker {
                identity: id.clone(),
                payload_hash: row.payload_hash.to_owned(),
                received_at: row.received_at,
                processed_at: row.processed_at,
                retention_until: row.retention_until,
                delivery_count: row.delivery_count,
            },
            result_reference: None,
            effects: Vec::new(),
        });
        Ok(MarkerInsert::Inserted)
    }

    async fn record_result(
        &self,
        tx: &DynamoTx,
        identity: &Identity,
        result_reference: Option<&str>,
        effects: &[NewEffect<'_>],
    ) -> Result<(), DynamoError> {
        let mut st = tx.lock();
        if st.closed {
            return Err(DynamoError::Closed);
        }
        let Some(p) = st
            .pending
            .iter_mut()
            .rev()
            .find(|p| p.marker.identity == *identity)
        else {
            return Err(DynamoError::NoMarker);
        };
        p.result_reference = result_reference.map(str::to_owned);
        p.effects = effects
            .iter()
            .enumerate()
            .map(|(i, e)| effect_item(e, i))
            .collect();
        Ok(())
    }

    async fn commit(&self, tx: DynamoTx) -> Result<Commit, DynamoError> {
        self.commit_inner(tx).await
    }

    async fn rollback(&self, tx: DynamoTx, _clean_end: bool) -> Result<(), DynamoError> {
        let mut st = tx.lock();
        st.closed = true;
        st.actions.clear();
        st.pending.clear();
        Ok(())
    }

    async fn record_rejection(&self, r: &Rejection<'_>) -> Result<(), DynamoError> {
        let id = uuid::Uuid::new_v4().to_string();
        let consumer = r.identity.consumer.as_str();
        let mut item = Item::new();
        item.insert(l::PK.into(), s(format!("r#{id}")));
        item.insert("kind".into(), s(r.kind.as_str()));
        item.insert("consumer".into(), s(consumer));
        item.insert("source".into(), s(&r.identity.source));
        item.insert("message_id".into(), s(&r.identity.message_id));
        if let Some(k) = &r.identity.business_key {
            item.insert("business_key".into(), s(k));
        }
        item.insert("payload_hash".into(), s(r.payload_hash));
        item.insert("conflicts_with".into(), s(r.conflicts_with));
        item.insert("detail".into(), s(r.detail));
        item.insert("recorded_at".into(), s(l::ts(r.recorded_at)));
        let until = r.recorded_at
            + chrono::Duration::from_std(self.options.rejections_keep)
                .unwrap_or(chrono::Duration::MAX);
        item.insert(l::EXPIRES_AT.into(), n(l::epoch_ceil(until)));
        item.insert("gsi1pk".into(), s(l::rejections_of(consumer)));
        item.insert("gsi1sk".into(), s(format!("{}#{id}", l::ts(r.recorded_at))));
        self.client
            .put_item()
            .table_name(&*self.table)
            .set_item(Some(item))
            .send()
            .await
            .map_err(|e| call("PutItem", e))?;
        Ok(())
    }

    fn is_transient(e: &DynamoError) -> bool {
        e.is_transient()
    }

    fn classify(e: &(dyn std::error::Error + 'static)) -> Option<bool> {
        e.downcast_ref::<DynamoError>()
            .map(DynamoError::is_transient)
    }
}

/// Readiness depends on the table: `DescribeTable` answers and the table is `ACTIVE` (or `UPDATING`, which
/// still serves reads and writes). The error names the table's status or DynamoDB's error code, never a
/// credential.
impl txinbox_core::runtime::health::HealthCheck for DynamoStore {
    fn check(&self) -> txinbox_core::runtime::health::CheckFuture<'_> {
        Box::pin(async move {
            let out = self
                .client
                .describe_table()
                .table_name(&*self.table)
                .send()
                .await
                .map_err(|e| call("DescribeTable", e).to_string())?;
            let status = out
                .table()
                .and_then(|t| t.table_status())
                .map(|s| s.as_str().to_owned())
                .unwrap_or_default();
            match status.as_str() {
                "ACTIVE" | "UPDATING" => Ok(()),
                other => Err(format!("table {} is {other}", self.table)),
            }
        })
    }
}
