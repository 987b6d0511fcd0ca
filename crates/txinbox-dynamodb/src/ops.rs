//! Read-only queries for an operator on a DynamoDB store: one consumer's figures, one message's story, and
//! a consumer's rejections (`txinbox inbox stats|show|rejections --store dynamodb://TABLE`).
//!
//! The result types mirror those of the SQL stores' `txinbox_store::ops` field for field (this crate does not
//! depend on the SQL store), with one difference: a rejection's id is the evidence item's UUID, not a number.
//!
//! ## What each query reads
//!
//! Every read goes through a key: a `GetItem` of one item, or a `Query` of one partition of the
//! `by_consumer` index (eventually consistent, as every index read). A `Query` is billed for every item it
//! reads from the partition's key range, about **0.5 read unit per 4 KB** read (eventually consistent),
//! whatever its filter or projection keeps and even with `Select=COUNT`: a filter only trims the answer.
//! There is no scan anywhere, and no way to list consumers (no index has them), so every query names its
//! consumer.
//!
//! | query | reads |
//! |---|---|
//! | [`DynamoStore::consumer_stats`] | the consumer's marker partition and evidence partition (every item not yet deleted by the TTL), and the 8 effect shards (every effect of every consumer) |
//! | [`DynamoStore::message_story`] | one `GetItem` (the marker), the consumer's evidence partition, and either one `GetItem` per effect name given or the 8 effect shards |
//! | [`DynamoStore::rejections`] | the consumer's evidence partition between `since` and `until`, newest first, until `limit` rows of the kind asked are found |
//!
//! Expired items (`expires_at` passed, not yet deleted by the TTL) are left out, as the store treats them:
//! absent from that second on. They are still read, and billed, until the TTL deletes them.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::types::AttributeValue;
use chrono::{DateTime, Utc};
use txinbox_core::effects::{idempotency_key, EffectState, EffectStore};
use txinbox_core::pipeline::identity::{IdOrigin, Identity};
use txinbox_core::ConsumerName;

use crate::error::call;
use crate::layout::{self as l, n, s, Item, Reader};
use crate::{DynamoError, DynamoStore};

/// The rejection kinds the inbox records, in the order they are reported.
pub const REJECTION_KINDS: [&str; 2] = ["payload_collision", "business_duplicate"];

/// Effect states counted as waiting to run: the oldest of them is the effect lag.
pub const WAITING_EFFECT_STATES: [&str; 3] = ["pending", "in_flight", "uncertain"];

/// The most rows [`RejectionFilter::limit`] accepts.
pub const MAX_REJECTIONS: i64 = 10_000;

/// One consumer's figures: markers, growth, rejections and effects.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ConsumerStats {
    /// The consumer's name.
    pub consumer: String,
    /// Its markers not yet expired (an exact count).
    pub inbox_rows: i64,
    /// The oldest marker's `processed_at`; `None` without markers.
    pub oldest_processed_at: Option<DateTime<Utc>>,
    /// The newest marker's `processed_at`; `None` without markers.
    pub newest_processed_at: Option<DateTime<Utc>>,
    /// Markers processed in the hour before [`ConsumerStats::measured_at`].
    pub rows_last_hour: i64,
    /// Rejections by kind: `payload_collision` and `business_duplicate` are always present (0 when none).
    pub rejections: BTreeMap<String, i64>,
    /// The newest rejection's time; `None` without rejections.
    pub last_rejection_at: Option<DateTime<Utc>>,
    /// Effects by state: every state of [`EffectState::ALL`] is present (0 when none).
    pub effects: BTreeMap<String, i64>,
    /// The oldest effect still waiting to run (`pending`, `in_flight` or `uncertain`): its `created_at`.
    pub oldest_pending_effect_at: Option<DateTime<Utc>>,
    /// Seconds from [`ConsumerStats::oldest_pending_effect_at`] to [`ConsumerStats::measured_at`]; `None`
    /// when no effect waits.
    pub effect_lag_seconds: Option<f64>,
    /// When the figures were taken.
    pub measured_at: DateTime<Utc>,
}

/// A marker: every attribute of a marker item the SQL stores have a column for.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MarkerView {
    /// The consumer.
    pub consumer: String,
    /// The message's source (`""` when the identity has none).
    pub source: String,
    /// The message id.
    pub message_id: String,
    /// The event type.
    pub event_type: Option<String>,
    /// The business key.
    pub business_key: Option<String>,
    /// The payload's fingerprint.
    pub payload_hash: String,
    /// The contract version.
    pub contract_version: Option<String>,
    /// The tenant.
    pub tenant_id: Option<String>,
    /// When the delivery that applied the message was received.
    pub received_at: DateTime<Utc>,
    /// When it was applied.
    pub processed_at: DateTime<Utc>,
    /// The handler's result reference.
    pub result_reference: Option<String>,
    /// Until when the marker is kept.
    pub retention_until: DateTime<Utc>,
    /// Where the message id came from.
    pub id_origin: String,
    /// The broker's delivery count of the applied delivery.
    pub delivery_count: i64,
}

/// A rejection: a payload collision or a business duplicate, with its evidence.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionRow {
    /// The evidence item's id (a UUID).
    pub id: String,
    /// The consumer.
    pub consumer: String,
    /// The rejected message's source.
    pub source: String,
    /// The rejected message's id.
    pub message_id: String,
    /// `payload_collision` or `business_duplicate`.
    pub kind: String,
    /// The rejected message's business key.
    pub business_key: Option<String>,
    /// The rejected message's payload hash.
    pub payload_hash: String,
    /// The stored hash (a collision) or the holder's message id (a business duplicate).
    pub conflicts_with: String,
    /// Free detail.
    pub detail: String,
    /// When it was recorded.
    pub recorded_at: DateTime<Utc>,
}

/// An effect of a message (its payload is not shown).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct EffectView {
    /// The effect's id ([`layout::effect_id`](crate::layout::effect_id) of its key).
    pub id: i64,
    /// The idempotency key.
    pub key: String,
    /// The effect's name.
    pub name: String,
    /// The destination.
    pub destination: String,
    /// The reference the destination knows it by.
    pub external_ref: String,
    /// The ordered group, if any.
    pub group_key: Option<String>,
    /// The state (`pending`, `in_flight`, `done`, ...).
    pub state: String,
    /// Calls made.
    pub attempts: i64,
    /// Reconciliations made.
    pub reconciliations: i64,
    /// When it is due next.
    pub next_attempt_at: DateTime<Utc>,
    /// The runner holding its claim.
    pub claimed_by: Option<String>,
    /// Until when the claim holds.
    pub claim_until: Option<DateTime<Utc>>,
    /// The destination's reference of the done effect.
    pub reference: Option<String>,
    /// The last error (or a compensation's note).
    pub last_error: Option<String>,
    /// When it was recorded (the inbox transaction).
    pub created_at: DateTime<Utc>,
    /// Its last change.
    pub updated_at: DateTime<Utc>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
}

/// Everything the store knows of one message of one consumer.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MessageStory {
    /// The consumer asked about.
    pub consumer: String,
    /// The message id asked about.
    pub message_id: String,
    /// The source asked about (always given on DynamoDB: it is part of the marker's key).
    pub source: Option<String>,
    /// Its marker (zero or one).
    pub markers: Vec<MarkerView>,
    /// Its rejections (of this source), oldest first.
    pub rejections: Vec<RejectionRow>,
    /// Its effects, by id (effects have no source: all of the message id's, or those named).
    pub effects: Vec<EffectView>,
}

impl MessageStory {
    /// Whether the store knows anything of the message.
    pub fn found(&self) -> bool {
        !(self.markers.is_empty() && self.rejections.is_empty() && self.effects.is_empty())
    }
}

/// Which rejections of one consumer to list, newest first.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RejectionFilter {
    /// The consumer (its evidence partition is the one read).
    pub consumer: String,
    /// Only this kind (`payload_collision` or `business_duplicate`).
    pub kind: Option<String>,
    /// Recorded at or after.
    pub since: Option<DateTime<Utc>>,
    /// Recorded before.
    pub until: Option<DateTime<Utc>>,
    /// At most this many (1 to [`MAX_REJECTIONS`]; default 50).
    pub limit: i64,
}

impl RejectionFilter {
    /// Every kind of `consumer`'s rejections, the 50 newest.
    pub fn new(consumer: impl Into<String>) -> Self {
        Self {
            consumer: consumer.into(),
            kind: None,
            since: None,
            until: None,
            limit: 50,
        }
    }
    /// Only this kind.
    pub fn kind(mut self, k: impl Into<String>) -> Self {
        self.kind = Some(k.into());
        self
    }
    /// Recorded at or after `t`.
    pub fn since(mut self, t: DateTime<Utc>) -> Self {
        self.since = Some(t);
        self
    }
    /// Recorded before `t`.
    pub fn until(mut self, t: DateTime<Utc>) -> Self {
        self.until = Some(t);
        self
    }
    /// At most `n` rows (clamped to 1..=[`MAX_REJECTIONS`]).
    pub fn limit(mut self, n: i64) -> Self {
        self.limit = n.clamp(1, MAX_REJECTIONS);
        self
    }
}

/// The time at the head of a `by_consumer` sort key (`<RFC 3339>#<id>`).
fn sk_time(sk: &str) -> Option<DateTime<Utc>> {
    sk.split('#')
        .next()
        .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.with_timezone(&Utc))
}

fn marker_from(item: &Item) -> Result<MarkerView, DynamoError> {
    let r = Reader::new(item);
    Ok(MarkerView {
        consumer: r.s("consumer")?,
        source: r.s("source")?,
        message_id: r.s("message_id")?,
        event_type: r.opt_s("event_type")?,
        business_key: r.opt_s("business_key")?,
        payload_hash: r.s("payload_hash")?,
        contract_version: r.opt_s("contract_version")?,
        tenant_id: r.opt_s("tenant_id")?,
        received_at: r.time("received_at")?,
        processed_at: r.time("processed_at")?,
        result_reference: r.opt_s("result_reference")?,
        retention_until: r.time("retention_until")?,
        id_origin: r.s("id_origin")?,
        delivery_count: r.i64("delivery_count")?,
    })
}

fn rejection_from(item: &Item) -> Result<RejectionRow, DynamoError> {
    let r = Reader::new(item);
    let pk = r.s(l::PK)?;
    Ok(RejectionRow {
        id: pk.strip_prefix("r#").unwrap_or(&pk).to_owned(),
        consumer: r.s("consumer")?,
        source: r.s("source")?,
        message_id: r.s("message_id")?,
        kind: r.s("kind")?,
        business_key: r.opt_s("business_key")?,
        payload_hash: r.s("payload_hash")?,
        conflicts_with: r.s("conflicts_with")?,
        detail: r.s("detail")?,
        recorded_at: r.time("recorded_at")?,
    })
}

fn effect_from(item: &Item) -> Result<EffectView, DynamoError> {
    let r = Reader::new(item);
    Ok(EffectView {
        id: r.i64("id")?,
        key: r.s("key")?,
        name: r.s("name")?,
        destination: r.s("destination")?,
        external_ref: r.s("external_ref")?,
        group_key: r.opt_s("group_key")?,
        state: r.s("state")?,
        attempts: r.i64("attempts")?,
        reconciliations: r.i64("reconciliations")?,
        next_attempt_at: r.time("next_at")?,
        claimed_by: r.opt_s("claimed_by")?,
        claim_until: r.opt_time("claim_until")?,
        reference: r.opt_s("result_reference")?,
        last_error: r.opt_s("last_error")?,
        created_at: r.time("created_at")?,
        updated_at: r.time("updated_at")?,
        finished_at: r.opt_time("finished_at")?,
    })
}

/// Whether an item is past its `expires_at` (the store treats it as absent).
fn expired(item: &Item, now_epoch: i64) -> Result<bool, DynamoError> {
    Ok(Reader::new(item)
        .opt_i64(l::EXPIRES_AT)?
        .is_some_and(|e| e < now_epoch))
}

/// One `Query` of a `by_consumer` partition, page after page.
struct PartitionQuery<'a> {
    partition: String,
    /// The sort key's bounds: at or after, before.
    from: Option<String>,
    before: Option<String>,
    newest_first: bool,
    /// A filter expression and its values (names are `#`-prefixed attribute names, mapped as is).
    filter: Option<&'a str>,
    values: Vec<(&'a str, AttributeValue)>,
    names: &'a [&'a str],
    projection: Option<&'a str>,
    /// Stop once this many items were kept.
    max_items: Option<usize>,
}

impl<'a> PartitionQuery<'a> {
    fn new(partition: String) -> Self {
        Self {
            partition,
            from: None,
            before: None,
            newest_first: false,
            filter: None,
            values: Vec::new(),
            names: &[],
            projection: None,
            max_items: None,
        }
    }
}

impl DynamoStore {
    async fn query_partition(&self, q: PartitionQuery<'_>) -> Result<Vec<Item>, DynamoError> {
        let key = match (&q.from, &q.before) {
            (None, None) => "gsi1pk = :p",
            (Some(_), None) => "gsi1pk = :p AND gsi1sk >= :from",
            (None, Some(_)) => "gsi1pk = :p AND gsi1sk < :before",
            // `BETWEEN` is inclusive; no sort key equals a bare time (each ends with `#<id>`), so `:before`
            // itself is never returned.
            (Some(_), Some(_)) => "gsi1pk = :p AND gsi1sk BETWEEN :from AND :before",
        };
        let mut out = Vec::new();
        let mut start = None;
        loop {
            let mut req = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(l::BY_CONSUMER)
                .key_condition_expression(key)
                .expression_attribute_values(":p", s(&q.partition))
                .scan_index_forward(!q.newest_first)
                .set_exclusive_start_key(start);
            if let Some(f) = &q.from {
                req = req.expression_attribute_values(":from", s(f));
            }
            if let Some(b) = &q.before {
                req = req.expression_attribute_values(":before", s(b));
            }
            if let Some(f) = q.filter {
                req = req.filter_expression(f);
            }
            for (k, v) in &q.values {
                req = req.expression_attribute_values(*k, v.clone());
            }
            for name in q.names {
                req = req.expression_attribute_names(format!("#{name}"), *name);
            }
            if let Some(p) = q.projection {
                req = req.projection_expression(p);
            }
            if let Some(max) = q.max_items {
                // A page never reads more than is still wanted (a filter may keep fewer: then more pages).
                req = req.limit((max - out.len()).clamp(1, 1000) as i32);
            }
            let page = req.send().await.map_err(|e| call("Query", e))?;
            for item in page.items() {
                out.push(item.clone());
                if q.max_items.is_some_and(|m| out.len() >= m) {
                    return Ok(out);
                }
            }
            match page.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok(out),
            }
        }
    }

    /// One consumer's figures, `now` being the reference of the last hour and of the effect lag.
    ///
    /// Reads the consumer's marker partition of `by_consumer` (every marker not yet deleted by the TTL,
    /// projected to its sort key), its evidence partition, and the 8 effect shards through
    /// [`EffectStore::effect_counts`] (every effect of every consumer): about 0.5 read unit per 4 KB of
    /// items read.
    pub async fn consumer_stats(
        &self,
        consumer: &str,
        now: DateTime<Utc>,
    ) -> Result<ConsumerStats, DynamoError> {
        let now_epoch = now.timestamp();
        let hour_ago = l::ts(now - chrono::Duration::hours(1));
        let mut stats = ConsumerStats {
            consumer: consumer.to_owned(),
            inbox_rows: 0,
            oldest_processed_at: None,
            newest_processed_at: None,
            rows_last_hour: 0,
            rejections: REJECTION_KINDS
                .iter()
                .map(|k| ((*k).to_owned(), 0))
                .collect(),
            last_rejection_at: None,
            effects: EffectState::ALL
                .iter()
                .map(|s| (s.as_str().to_owned(), 0))
                .collect(),
            oldest_pending_effect_at: None,
            effect_lag_seconds: None,
            measured_at: now,
        };
        let live = "attribute_not_exists(#expires_at) OR #expires_at >= :now";

        // Markers: one pass over the partition, oldest first. The last hour comes from the same items (a
        // second query with `gsi1sk >= now-1h` would read those items twice).
        let mut q = PartitionQuery::new(l::markers_of(consumer));
        q.filter = Some(live);
        q.values = vec![(":now", n(now_epoch))];
        q.names = &["expires_at"];
        q.projection = Some("gsi1sk");
        for item in self.query_partition(q).await? {
            let sk = Reader::new(&item).s("gsi1sk")?;
            stats.inbox_rows += 1;
            if sk.as_str() >= hour_ago.as_str() {
                stats.rows_last_hour += 1;
            }
            if let Some(t) = sk_time(&sk) {
                stats.oldest_processed_at = Some(stats.oldest_processed_at.map_or(t, |o| o.min(t)));
                stats.newest_processed_at = Some(stats.newest_processed_at.map_or(t, |o| o.max(t)));
            }
        }

        // Rejections by kind.
        let mut q = PartitionQuery::new(l::rejections_of(consumer));
        q.filter = Some(live);
        q.values = vec![(":now", n(now_epoch))];
        q.names = &["expires_at", "kind"];
        q.projection = Some("gsi1sk, #kind");
        for item in self.query_partition(q).await? {
            let r = Reader::new(&item);
            *stats.rejections.entry(r.s("kind")?).or_insert(0) += 1;
            if let Some(t) = sk_time(&r.s("gsi1sk")?) {
                stats.last_rejection_at = stats.last_rejection_at.max(Some(t));
            }
        }

        // Effects by state.
        for c in self.effect_counts().await? {
            if c.consumer != consumer {
                continue;
            }
            *stats
                .effects
                .entry(c.state.as_str().to_owned())
                .or_insert(0) += c.count;
            if WAITING_EFFECT_STATES.contains(&c.state.as_str()) {
                if let Some(t) = c.oldest {
                    stats.oldest_pending_effect_at =
                        Some(stats.oldest_pending_effect_at.map_or(t, |o| o.min(t)));
                }
            }
        }
        stats.effect_lag_seconds = stats
            .oldest_pending_effect_at
            .map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
        Ok(stats)
    }

    /// One message's story: its marker (a `GetItem` by consumer, source and message id: the source is part
    /// of the key), its rejections of that source (the consumer's evidence partition, filtered on the
    /// message id: the whole partition is read), and its effects.
    ///
    /// With `effect_names`, each effect is one `GetItem` by its idempotency key (about 0.5 read unit each);
    /// without, the 8 effect shards are queried with a filter on consumer and message id, which reads every
    /// effect of every consumer.
    pub async fn message_story(
        &self,
        consumer: &str,
        message_id: &str,
        source: &str,
        effect_names: Option<&[String]>,
    ) -> Result<MessageStory, DynamoError> {
        let now_epoch = Utc::now().timestamp();
        let mut markers = Vec::new();
        let out = self
            .client
            .get_item()
            .table_name(&*self.table)
            .key(l::PK, s(l::marker_pk(consumer, source, message_id)))
            .send()
            .await
            .map_err(|e| call("GetItem", e))?;
        if let Some(item) = out.item() {
            if !expired(item, now_epoch)? {
                markers.push(marker_from(item)?);
            }
        }

        let mut q = PartitionQuery::new(l::rejections_of(consumer));
        q.filter = Some(
            "#message_id = :m AND #source = :s AND (attribute_not_exists(#expires_at) OR #expires_at >= :now)",
        );
        q.values = vec![
            (":m", s(message_id)),
            (":s", s(source)),
            (":now", n(now_epoch)),
        ];
        q.names = &["message_id", "source", "expires_at"];
        let rejections = self
            .query_partition(q)
            .await?
            .iter()
            .map(rejection_from)
            .collect::<Result<Vec<_>, _>>()?;

        let mut items = Vec::new();
        match effect_names {
            Some(names) => {
                let identity = Identity {
                    consumer: ConsumerName::new(consumer).map_err(|e| DynamoError::Corrupt {
                        pk: l::marker_pk(consumer, source, message_id),
                        detail: format!("consumer name {consumer:?} is not valid: {e}"),
                    })?,
                    source: source.to_owned(),
                    message_id: message_id.to_owned(),
                    origin: IdOrigin::ProducerId,
                    event_type: None,
                    contract_version: None,
                    tenant_id: None,
                    business_key: None,
                    event_time: None,
                };
                for name in names {
                    let key = idempotency_key(&identity, name);
                    let out = self
                        .client
                        .get_item()
                        .table_name(&*self.table)
                        .key(l::PK, s(l::effect_pk(l::effect_id(&key))))
                        .send()
                        .await
                        .map_err(|e| call("GetItem", e))?;
                    if let Some(item) = out.item() {
                        if Reader::new(item).s("key")? == key {
                            items.push(item.clone());
                        }
                    }
                }
            }
            None => {
                for shard in 0..l::EFFECT_SHARDS {
                    let mut q = PartitionQuery::new(l::effect_shard(shard));
                    q.filter = Some("#consumer = :c AND #message_id = :m");
                    q.values = vec![(":c", s(consumer)), (":m", s(message_id))];
                    q.names = &["consumer", "message_id"];
                    items.extend(self.query_partition(q).await?);
                }
            }
        }
        let mut effects = Vec::with_capacity(items.len());
        for item in &items {
            if !expired(item, now_epoch)? {
                effects.push(effect_from(item)?);
            }
        }
        effects.sort_by_key(|e| e.id);
        effects.dedup_by_key(|e| e.id);
        Ok(MessageStory {
            consumer: consumer.to_owned(),
            message_id: message_id.to_owned(),
            source: Some(source.to_owned()),
            markers,
            rejections,
            effects,
        })
    }

    /// The consumer's rejections matching `filter`, newest first: a `Query` of its evidence partition with
    /// `ScanIndexForward=false`, bounded on the sort key by `since` and `until`, filtered on the kind, page
    /// after page until `limit` rows are found. It reads the partition's items between the bounds up to the
    /// last row returned (of every kind, when a kind is asked).
    pub async fn rejections(
        &self,
        filter: &RejectionFilter,
    ) -> Result<Vec<RejectionRow>, DynamoError> {
        if let (Some(a), Some(b)) = (filter.since, filter.until) {
            if a >= b {
                return Ok(Vec::new());
            }
        }
        let now_epoch = Utc::now().timestamp();
        let mut q = PartitionQuery::new(l::rejections_of(&filter.consumer));
        q.from = filter.since.map(l::ts);
        q.before = filter.until.map(l::ts);
        q.newest_first = true;
        q.max_items = Some(filter.limit.clamp(1, MAX_REJECTIONS) as usize);
        q.values = vec![(":now", n(now_epoch))];
        match &filter.kind {
            Some(k) => {
                q.filter = Some(
                    "#kind = :k AND (attribute_not_exists(#expires_at) OR #expires_at >= :now)",
                );
                q.values.push((":k", s(k)));
                q.names = &["kind", "expires_at"];
            }
            None => {
                q.filter = Some("attribute_not_exists(#expires_at) OR #expires_at >= :now");
                q.names = &["expires_at"];
            }
        }
        self.query_partition(q)
            .await?
            .iter()
            .map(rejection_from)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_give_their_time_and_bound_as_text() {
        let t = DateTime::parse_from_rfc3339("2026-01-02T03:04:05.000006Z")
            .unwrap()
            .with_timezone(&Utc);
        let sk = format!("{}#{}", l::ts(t), "abc");
        assert_eq!(sk_time(&sk), Some(t));
        // `recorded_at >= since` and `recorded_at < until` as text comparisons of the sort key.
        assert!(sk.as_str() >= l::ts(t).as_str());
        assert!(sk.as_str() > l::ts(t).as_str(), "until == t excludes t");
        assert!(sk.as_str() < l::ts(t + chrono::Duration::microseconds(1)).as_str());
    }

    #[test]
    fn the_filter_clamps_its_limit() {
        assert_eq!(RejectionFilter::new("c").limit(0).limit, 1);
        assert_eq!(
            RejectionFilter::new("c").limit(1_000_000).limit,
            MAX_REJECTIONS
        );
    }
}
