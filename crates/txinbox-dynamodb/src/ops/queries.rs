//! The operator queries on [`DynamoStore`]: a consumer's figures, a message's story, the rejections.

use chrono::{DateTime, Utc};
use txinbox_core::effects::{idempotency_key, EffectStore};
use txinbox_core::pipeline::identity::{IdOrigin, Identity};
use txinbox_core::ConsumerName;

use super::partition::PartitionQuery;
use super::rows::{effect_from, expired, marker_from, rejection_from, sk_time};
use super::{
    ConsumerStats, MessageStory, RejectionFilter, RejectionRow, MAX_REJECTIONS,
    WAITING_EFFECT_STATES,
};
use crate::layout::{self as l, n, s, Reader};
use crate::{DynamoError, DynamoStore};

impl DynamoStore {
    /// One consumer's figures, `now` being the reference of the last hour and of the effect lag (the items
    /// counted are those not expired by the clock).
    ///
    /// Reads the consumer's 16 marker partitions of `by_consumer` (every marker not yet deleted by the TTL,
    /// projected to its sort key), its evidence partition, and the 8 effect shards through
    /// [`EffectStore::effect_counts`] (every effect of every consumer): about 0.5 read unit per 4 KB of
    /// items read.
    pub async fn consumer_stats(
        &self,
        consumer: &str,
        now: DateTime<Utc>,
    ) -> Result<ConsumerStats, DynamoError> {
        // Expiry is the clock's, whatever `now` the caller gives (as in every other query).
        let now_epoch = Utc::now().timestamp();
        // Saturated: `now` is the caller's, the earliest date there is included.
        let hour_ago = l::ts(txinbox_core::time::before(
            now,
            std::time::Duration::from_secs(3600),
        ));
        let mut stats = ConsumerStats::new(consumer, now);
        let live = "attribute_not_exists(#expires_at) OR #expires_at >= :now";

        // Markers: one pass over each of the consumer's marker partitions. The last hour comes from the same
        // items (a second query with `gsi1sk >= now-1h` would read those items twice).
        let mut markers = Vec::new();
        for partition in l::marker_partitions(consumer) {
            let mut q = PartitionQuery::new(partition);
            q.filter = Some(live);
            q.values = vec![(":now", n(now_epoch))];
            q.names = &["expires_at"];
            q.projection = Some("gsi1sk");
            markers.extend(self.query_partition(q).await?);
        }
        for item in markers {
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
    /// With `effect_names`, each effect is one `GetItem` by its idempotency key; without, the 8 effect shards
    /// are queried with a filter on consumer and message id, which reads every effect of every consumer.
    ///
    /// The `GetItem`s (the marker, the named effects) read the base table strongly consistently
    /// (`ConsistentRead`, one read unit per 4 KB): a message applied or an effect recorded a moment ago is
    /// found (AWS: with eventually consistent reads "the responses may not reflect the results of a recently
    /// completed write operation"). The rejections and the effects found without names are read from the
    /// `by_consumer` index, which cannot be read consistently (AWS: "All reads from GSIs and streams are
    /// eventually consistent"): a rejection or an effect written a moment ago may be missing from them.
    pub async fn message_story(
        &self,
        consumer: &str,
        message_id: &str,
        source: &str,
        effect_names: Option<&[String]>,
    ) -> Result<MessageStory, DynamoError> {
        let now_epoch = Utc::now().timestamp();
        let mut markers = Vec::new();
        let pk = l::marker_pk(consumer, source, message_id);
        if l::fits_key(&pk) {
            if let Some(item) = self.get_consistent(s(pk), &[]).await? {
                if !expired(&item, now_epoch)? {
                    markers.push(marker_from(&item)?);
                }
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
            // A consumer name no message can have: no effect of it exists (nothing to look up).
            Some(_) if ConsumerName::new(consumer).is_err() => {}
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
                    let pk = s(l::effect_pk(l::effect_id(&key)));
                    if let Some(item) = self.get_consistent(pk, &[]).await? {
                        if Reader::new(&item).s("key")? == key {
                            items.push(item);
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
    ///
    /// # Errors
    /// [`DynamoError::NeedsKey`] when the filter names no consumer; the call's error otherwise.
    pub async fn rejections(
        &self,
        filter: &RejectionFilter,
    ) -> Result<Vec<RejectionRow>, DynamoError> {
        let consumer = filter
            .consumer
            .as_deref()
            .ok_or(DynamoError::NeedsKey("the rejections of every consumer"))?;
        if let (Some(a), Some(b)) = (filter.since, filter.until) {
            if a >= b {
                return Ok(Vec::new());
            }
        }
        let now_epoch = Utc::now().timestamp();
        let mut q = PartitionQuery::new(l::rejections_of(consumer));
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
