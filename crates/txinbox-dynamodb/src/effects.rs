//! Effects and maintenance on DynamoDB: claimed by conditional updates found through the `due` index,
//! finished under the holder's condition, expired by the TTL.

use std::collections::BTreeMap;

use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::types::{AttributeValue, ReturnValue, ReturnValuesOnConditionCheckFailure};
use chrono::{DateTime, Utc};
use txinbox_core::effects::{
    ClaimedEffect, EffectCount, EffectState, EffectStore, TransitionColumns,
};
use txinbox_core::runtime::maintenance::{MaintenanceStore, Table};

use crate::error::call;
use crate::layout::{self as l, n, s, Item, Reader};
use crate::{DynamoError, DynamoStore};

/// Due by `:clock`, or in flight under a claim that ended before it (this host's clock: see
/// [`EffectStore::claim_effects`]).
const CLAIMABLE: &str = "(#state IN (:pending, :uncertain) AND next_at <= :clock) OR (#state = :in_flight AND claim_until < :clock)";

fn state_of(r: &Reader<'_>) -> Result<EffectState, DynamoError> {
    let v = r.s("state")?;
    EffectState::parse(&v).ok_or_else(|| DynamoError::Corrupt {
        pk: r.s(l::PK).unwrap_or_default(),
        detail: format!("unknown effect state {v:?}"),
    })
}

/// Whether an item is past its `expires_at` at `now` (epoch seconds): the store treats it as absent.
fn expired(r: &Reader<'_>, now: i64) -> Result<bool, DynamoError> {
    Ok(r.opt_i64(l::EXPIRES_AT)?.is_some_and(|e| e < now))
}

fn claimed(item: &Item, from: EffectState) -> Result<ClaimedEffect, DynamoError> {
    let r = Reader::new(item);
    Ok(ClaimedEffect {
        id: r.i64("id")?,
        consumer: r.s("consumer")?,
        message_id: r.s("message_id")?,
        key: r.s("key")?,
        name: r.s("name")?,
        destination: r.s("destination")?,
        payload: r.bytes("payload")?,
        metadata: r.string_map("metadata")?,
        external_ref: r.s("external_ref")?,
        claimed_from: from,
        attempts: r.i64("attempts")? as i32,
        reconciliations: r.i64("reconciliations")? as i32,
        created_at: r.time("created_at")?,
        reference: r.opt_s("result_reference")?,
        maybe_happened: r.bool("maybe_happened")?,
        sent_hash: r.opt_s("sent_hash")?,
    })
}

/// The attribute an effect's claim, finish or compensation writes its own token into: see [`own_write`].
const WRITE_TOKEN: &str = "write_token";

/// The item a conditional `UpdateItem` refused with `ConditionalCheckFailedException` met, when it is the
/// update's own write. An `UpdateItem` carries no idempotency token, and the SDK sends it again by itself when
/// its answer is lost (a timeout, a connection closed after the request, a 5xx): when the first attempt
/// applied, the retry meets the item as that attempt left it and its condition fails. The update writes a
/// token of its call into the item ([`WRITE_TOKEN`]) and asks for the item on a failed condition (`ALL_OLD`):
/// the item holding that token is the call's own write, applied.
fn own_write<'e, R>(
    e: &'e aws_sdk_dynamodb::error::SdkError<UpdateItemError, R>,
    token: &str,
) -> Option<&'e Item> {
    match e.as_service_error() {
        Some(UpdateItemError::ConditionalCheckFailedException(c)) => c.item().filter(|item| {
            item.get(WRITE_TOKEN)
                .and_then(|v| v.as_s().ok())
                .is_some_and(|t| t == token)
        }),
        _ => None,
    }
}

/// One `due` partition as a claim reads it, a page at a time.
struct Cursor {
    partition: String,
    /// Where its next page starts (DynamoDB's `LastEvaluatedKey`).
    start: Option<Item>,
    /// The greatest sort key read from it so far (empty before its first entry).
    last: String,
    /// Whether it has entries beyond `last`.
    more: bool,
    /// Whether the next round reads its next page.
    read: bool,
}

impl DynamoStore {
    fn effect_key(id: i64) -> (String, AttributeValue) {
        (l::PK.to_owned(), s(l::effect_pk(id)))
    }

    /// The claim of [`EffectStore::claim_effects`], into `out` (kept by the caller whatever the result).
    async fn claim_into(
        &self,
        out: &mut Vec<ClaimedEffect>,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<(), DynamoError> {
        let now_s = l::ts(now);
        // Which effects are due, which claims expired, and when this one ends, are this host's clock's (the
        // SQL stores' database's clock: see `claim_effects`); the claim lasts `claim_until - now`.
        let clock = Utc::now();
        let clock_s = l::ts(clock);
        let ends = txinbox_core::effects::claim_end(clock, now, claim_until);
        let bound = format!("{clock_s}#~");
        // The destinations' partitions (each once), merged in the order their effects fell due, whatever
        // their destination: each partition is read a page at a time, and an entry is tried only once every
        // partition that has more has been read past it, so that a page of one partition filled with effects
        // held back by their group never lets a newer effect of another partition go before an older
        // claimable one behind them.
        let partitions: std::collections::BTreeSet<String> = destinations
            .iter()
            .flat_map(|d| l::due_partitions(d))
            .filter(|p| l::fits_key(p))
            .collect();
        let mut cursors: Vec<Cursor> = partitions
            .into_iter()
            .map(|partition| Cursor {
                partition,
                start: None,
                last: String::new(),
                more: true,
                read: true,
            })
            .collect();
        // Entries read and not tried yet, in the order they fell due (the sort key, then the id).
        let mut pool: std::collections::BTreeSet<(String, i64)> = Default::default();
        // The effects this claim took: a claim moves an effect's sort key (to its claim's end), where a later
        // page may meet it again, due again at once if that end is before `now`; it is held once.
        let mut taken = std::collections::HashSet::new();
        while (out.len() as i64) < limit {
            for cursor in cursors.iter_mut().filter(|c| c.read) {
                let page = self
                    .client
                    .query()
                    .table_name(&*self.table)
                    .index_name(l::DUE)
                    .key_condition_expression("gsi2pk = :d AND gsi2sk <= :bound")
                    .expression_attribute_values(":d", s(&cursor.partition))
                    .expression_attribute_values(":bound", s(&bound))
                    .limit(limit.clamp(1, 100) as i32)
                    .set_exclusive_start_key(cursor.start.take())
                    .send()
                    .await
                    .map_err(|e| call("Query", e))?;
                for key in page.items() {
                    let Some(sk) = key.get("gsi2sk").and_then(|v| v.as_s().ok()) else {
                        continue;
                    };
                    if *sk > cursor.last {
                        cursor.last.clone_from(sk);
                    }
                    let Some(id) = key
                        .get(l::PK)
                        .and_then(|v| v.as_s().ok())
                        .and_then(|p| p.strip_prefix("e#"))
                        .and_then(|i| i.parse::<i64>().ok())
                    else {
                        continue;
                    };
                    pool.insert((sk.clone(), id));
                }
                cursor.start = page.last_evaluated_key().cloned();
                cursor.more = cursor.start.is_some();
                cursor.read = false;
            }
            // How far every partition has been read: entries up to there are the oldest left.
            let frontier = cursors
                .iter()
                .filter(|c| c.more)
                .map(|c| c.last.clone())
                .min();
            while (out.len() as i64) < limit {
                let Some(first) = pool.first() else { break };
                if frontier.as_ref().is_some_and(|f| first.0 > *f) {
                    break;
                }
                let Some((_, id)) = pool.pop_first() else {
                    break;
                };
                if taken.contains(&id) {
                    continue;
                }
                if let Some(c) = self.claim_one(id, holder, &now_s, &clock_s, ends).await? {
                    taken.insert(id);
                    out.push(c);
                }
            }
            let Some(frontier) = frontier else {
                // Every partition read to its end, and everything read tried.
                break;
            };
            // Read on the partitions that hold the frontier back.
            for c in cursors.iter_mut() {
                c.read = c.more && c.last == frontier;
            }
        }
        Ok(())
    }

    /// Claims effect `id` for `holder` until `claim_until` if it is still claimable (due by `clock_s`, or in
    /// flight under a claim ended before it) and not held back by its group; `now_s` is the runner's time.
    async fn claim_one(
        &self,
        id: i64,
        holder: &str,
        now_s: &str,
        clock_s: &str,
        claim_until: DateTime<Utc>,
    ) -> Result<Option<ClaimedEffect>, DynamoError> {
        let (k, v) = Self::effect_key(id);
        let Some(item) = self.get_consistent(v.clone(), &[]).await? else {
            return Ok(None);
        };
        if self.blocked_by_group(&item).await? {
            return Ok(None);
        }
        let token = uuid::Uuid::new_v4().to_string();
        let res = self
            .client
            .update_item()
            .table_name(&*self.table)
            .key(k, v)
            // `claimed_from` keeps the state the claim took the effect from (the operands of an update
            // expression read the item as it was before it), for a claim that finds its own write.
            .update_expression("SET #state = :in_flight, claimed_by = :h, claim_until = :cu, updated_at = :now, gsi2sk = :due, claimed_from = #state, #write_token = :write_token")
            .condition_expression(CLAIMABLE)
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_names("#state", "state")
            .expression_attribute_names("#write_token", WRITE_TOKEN)
            .expression_attribute_values(":write_token", s(&token))
            .expression_attribute_values(":pending", s("pending"))
            .expression_attribute_values(":uncertain", s("uncertain"))
            .expression_attribute_values(":in_flight", s("in_flight"))
            .expression_attribute_values(":now", s(now_s))
            .expression_attribute_values(":clock", s(clock_s))
            .expression_attribute_values(":h", s(holder))
            .expression_attribute_values(":cu", s(l::ts(claim_until)))
            .expression_attribute_values(":due", s(format!("{}#{id}", l::ts(claim_until))))
            .return_values(ReturnValue::AllOld)
            .send()
            .await;
        match res {
            Ok(r) => {
                let Some(old) = r.attributes() else {
                    return Ok(None);
                };
                let from = state_of(&Reader::new(old))?;
                let mut c = claimed(old, from)?;
                c.reference = None;
                Ok(Some(c))
            }
            Err(e) => {
                // The SDK's retry of this claim, whose first attempt applied and lost its answer: held, as
                // the first attempt left it, claimed from the state it kept.
                if let Some(item) = own_write(&e, &token) {
                    let r = Reader::new(item);
                    let from = r.s("claimed_from")?;
                    let from = EffectState::parse(&from).ok_or_else(|| DynamoError::Corrupt {
                        pk: r.s(l::PK).unwrap_or_default(),
                        detail: format!("unknown effect state {from:?} claimed from"),
                    })?;
                    let mut c = claimed(item, from)?;
                    c.reference = None;
                    return Ok(Some(c));
                }
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception())
                {
                    // Another runner claimed it first, or it is not due any more.
                    return Ok(None);
                }
                // No answer to tell whether it applied (every attempt of the SDK lost or failed): kept, so
                // that the claim can be given back (`release_claim`) if it did.
                if let Ok(mut unsure) = self.unsure_claims.lock() {
                    unsure
                        .entry(holder.to_owned())
                        .or_default()
                        .push((id, token));
                }
                Err(call("UpdateItem", e))
            }
        }
    }

    /// Gives back what the claim named `holder` may hold without knowing it: the effects whose claiming
    /// `UpdateItem` failed without an answer ([`DynamoStore::unsure_claims`]). Each one that claim's write holds
    /// (its `write_token`, still in flight) returns to the state it was claimed from, as on the SQL stores;
    /// one it does not hold (the write never applied, or the effect moved on) is left. Returns how many were
    /// given back; the first error after trying them all (those are left to expire, as before).
    async fn give_back(&self, holder: &str, now: DateTime<Utc>) -> Result<u64, DynamoError> {
        let unsure = match self.unsure_claims.lock() {
            Ok(mut u) => u.remove(holder).unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        let (mut given, mut failed) = (0, None);
        for (id, token) in unsure {
            match self.give_back_one(id, holder, &token, now).await {
                Ok(true) => given += 1,
                Ok(false) => {}
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        match failed {
            Some(e) => Err(e),
            None => Ok(given),
        }
    }

    /// Gives effect `id` back if the claim named `holder` whose write carried `token` holds it: pending or
    /// uncertain again at its due time, or, taken from an expired claim, in flight with its claim ended now
    /// (this host's clock), so that it is claimed again at once and reconciled first.
    async fn give_back_one(
        &self,
        id: i64,
        holder: &str,
        token: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DynamoError> {
        let (k, v) = Self::effect_key(id);
        let Some(item) = self.get_consistent(v.clone(), &[]).await? else {
            return Ok(false);
        };
        let r = Reader::new(&item);
        let held = r.opt_s(WRITE_TOKEN)?.as_deref() == Some(token)
            && r.opt_s("claimed_by")?.as_deref() == Some(holder)
            && state_of(&r)? == EffectState::InFlight;
        if !held {
            return Ok(false);
        }
        let from = r.s("claimed_from")?;
        let mine = uuid::Uuid::new_v4().to_string();
        let req = self
            .client
            .update_item()
            .table_name(&*self.table)
            .key(k, v)
            .condition_expression("#write_token = :claim_token AND #state = :in_flight")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_names("#state", "state")
            .expression_attribute_names("#write_token", WRITE_TOKEN)
            .expression_attribute_values(":claim_token", s(token))
            .expression_attribute_values(":write_token", s(&mine))
            .expression_attribute_values(":in_flight", s("in_flight"))
            .expression_attribute_values(":now", s(l::ts(now)));
        let req = match EffectState::parse(&from) {
            Some(back @ (EffectState::Pending | EffectState::Uncertain)) => req
                .update_expression("SET #state = :back, updated_at = :now, gsi2sk = :due, #write_token = :write_token REMOVE claimed_by, claim_until")
                .expression_attribute_values(":back", s(back.as_str()))
                .expression_attribute_values(":due", s(format!("{}#{id}", r.s("next_at")?))),
            Some(EffectState::InFlight) => {
                let ended = l::ts(Utc::now());
                req.update_expression("SET claim_until = :ended, updated_at = :now, gsi2sk = :due, #write_token = :write_token")
                    .expression_attribute_values(":due", s(format!("{ended}#{id}")))
                    .expression_attribute_values(":ended", s(ended))
            }
            _ => return Ok(false),
        };
        match req.send().await {
            Ok(_) => Ok(true),
            // The SDK's retry of this give-back, whose first attempt applied and lost its answer.
            Err(e) if own_write(&e, &mine).is_some() => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(call("UpdateItem", e)),
        }
    }

    /// Whether the effect recorded before this one in its group (`prev`, written in the transaction that
    /// recorded this one, from the group's tail item) is unfinished. Read strongly consistent: an effect is
    /// never claimed while the one before it is unfinished, whatever the indexes show. A `prev` that is gone
    /// (done, and deleted by the TTL since) holds nothing back.
    async fn blocked_by_group(&self, item: &Item) -> Result<bool, DynamoError> {
        let Some(prev) = item.get("prev") else {
            return Ok(false);
        };
        let older = self.get_consistent(prev.clone(), &["state"]).await?;
        Ok(match older {
            Some(o) => !matches!(
                state_of(&Reader::new(&o))?,
                EffectState::Done | EffectState::Failed | EffectState::Compensated
            ),
            None => false,
        })
    }

    /// Effects by consumer, destination and state, those past their `expires_at` left out (absent from that
    /// second on, as the store treats them, until the TTL deletes them).
    async fn effect_counts_inner(&self) -> Result<Vec<EffectCount>, DynamoError> {
        let now = Utc::now().timestamp();
        let mut counts: BTreeMap<(String, String, EffectState), EffectCount> = BTreeMap::new();
        for shard in 0..l::EFFECT_SHARDS {
            let mut start = None;
            loop {
                let out = self
                    .client
                    .query()
                    .table_name(&*self.table)
                    .index_name(l::BY_CONSUMER)
                    .key_condition_expression("gsi1pk = :p")
                    .expression_attribute_values(":p", s(l::effect_shard(shard)))
                    .projection_expression(
                        "consumer, destination, #state, created_at, result_reference, expires_at",
                    )
                    .expression_attribute_names("#state", "state")
                    .set_exclusive_start_key(start)
                    .send()
                    .await
                    .map_err(|e| call("Query", e))?;
                for item in out.items() {
                    let r = Reader::new(item);
                    if expired(&r, now)? {
                        continue;
                    }
                    let (consumer, destination, state) =
                        (r.s("consumer")?, r.s("destination")?, state_of(&r)?);
                    let created = r.time("created_at")?;
                    let c = counts
                        .entry((consumer.clone(), destination.clone(), state))
                        .or_insert(EffectCount {
                            consumer,
                            destination,
                            state,
                            count: 0,
                            oldest: None,
                            without_reference: 0,
                        });
                    c.count += 1;
                    c.oldest = Some(c.oldest.map_or(created, |o| o.min(created)));
                    if r.opt_s("result_reference")?.is_none() {
                        c.without_reference += 1;
                    }
                }
                match out.last_evaluated_key() {
                    Some(k) => start = Some(k.clone()),
                    None => break,
                }
            }
        }
        Ok(counts.into_values().collect())
    }

    /// [`partition_stats`](Self::partition_stats) of several partitions, summed.
    async fn partitions_stats(
        &self,
        partitions: impl Iterator<Item = String>,
        filter_consumer: Option<&str>,
    ) -> Result<(i64, Option<DateTime<Utc>>), DynamoError> {
        let mut count = 0;
        let mut oldest: Option<DateTime<Utc>> = None;
        for p in partitions {
            let (c, o) = self.partition_stats(&p, filter_consumer).await?;
            count += c;
            oldest = match (oldest, o) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        Ok((count, oldest))
    }

    /// Items of one `by_consumer` partition not yet expired: how many, and the oldest sort key's time.
    async fn partition_stats(
        &self,
        partition: &str,
        filter_consumer: Option<&str>,
    ) -> Result<(i64, Option<DateTime<Utc>>), DynamoError> {
        let now = Utc::now().timestamp();
        let mut count = 0i64;
        let mut oldest: Option<DateTime<Utc>> = None;
        if !l::fits_key(partition) {
            return Ok((count, oldest));
        }
        let mut start = None;
        loop {
            let mut q = self
                .client
                .query()
                .table_name(&*self.table)
                .index_name(l::BY_CONSUMER)
                .key_condition_expression("gsi1pk = :p")
                .expression_attribute_values(":p", s(partition))
                .expression_attribute_values(":now", n(now))
                .projection_expression("gsi1sk")
                .set_exclusive_start_key(start);
            q = match filter_consumer {
                Some(c) => q
                    .filter_expression("(attribute_not_exists(expires_at) OR expires_at >= :now) AND consumer = :c")
                    .expression_attribute_values(":c", s(c)),
                None => q.filter_expression("attribute_not_exists(expires_at) OR expires_at >= :now"),
            };
            let out = q.send().await.map_err(|e| call("Query", e))?;
            for item in out.items() {
                count += 1;
                let sk = Reader::new(item).s("gsi1sk")?;
                if let Some(t) = sk
                    .split('#')
                    .next()
                    .and_then(|t| DateTime::parse_from_rfc3339(t).ok())
                {
                    let t = t.with_timezone(&Utc);
                    oldest = Some(oldest.map_or(t, |o| o.min(t)));
                }
            }
            match out.last_evaluated_key() {
                Some(k) => start = Some(k.clone()),
                None => return Ok((count, oldest)),
            }
        }
    }
}

impl EffectStore for DynamoStore {
    type Error = DynamoError;

    /// Queries the `due` partitions of every destination for effects due by this host's clock, a page of each partition
    /// at a time, and claims them oldest first across the destinations with a conditional update
    /// (`pending`/`uncertain` and due, or `in_flight` with an expired claim): two runners that find the same
    /// effect race on the condition, and one wins. An effect behind an older unfinished one of its group is
    /// left for later. A limit below one is one, as on the SQL stores.
    ///
    /// **Clocks.** A condition cannot read a clock of DynamoDB's: which effects are due, which claims expired
    /// and when this one ends (it lasts `claim_until - now`) are decided by the clock of the host this store
    /// runs on, read at the claim (a finish keeps a due time on it too: `next_at - now` after it). Two runners
    /// of one table therefore agree on who holds an effect only as far as their hosts' clocks agree: a runner
    /// whose clock is ahead of a holder's by `d` takes the holder's effects over `d` early, and finds an
    /// effect due `d` early (an uncertain one reconciled `d` sooner than `reconcile_after` asked). A holder gives up its work `reconcile_after` of its destinations before its claim ends (none by
    /// default), so keep the hosts' clocks synchronised (NTP, chrony, the Amazon Time Sync Service: well under
    /// a second) and below that margin; a skew beyond it lets a second runner call while the first may still
    /// be calling.
    async fn claim_effects(
        &self,
        holder: &str,
        destinations: &[String],
        now: DateTime<Utc>,
        claim_until: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<ClaimedEffect>, DynamoError> {
        let limit = limit.max(1);
        let mut out = Vec::new();
        match self
            .claim_into(&mut out, holder, destinations, now, claim_until, limit)
            .await
        {
            Ok(()) => Ok(out),
            Err(e) if out.is_empty() => Err(e),
            // What was claimed is held: hand it to the runner rather than leave it until its claim expires.
            // One whose claim failed without an answer is given back, if that claim applied.
            Err(e) => {
                tracing::warn!(error = %e, claimed = out.len(), "claim: an error after some effects were claimed; those run, the others wait for the next poll");
                if let Err(e) = self.give_back(holder, now).await {
                    tracing::warn!(error = %e, "giving back a claim whose answer was lost failed: what it may hold is reconciled once it expires");
                }
                Ok(out)
            }
        }
    }

    /// Gives back the effects whose claim under `holder` failed without an answer (an `UpdateItem` whose every
    /// attempt, the SDK's retries included, was lost or failed) and applied all the same: the claim
    /// recognises its own write only when an SDK retry reaches DynamoDB and meets it (`write_token`), so one
    /// whose retries all failed held its effect, unknown to the runner, until its claim ran out. The store
    /// keeps those effects (in memory, per claim name) and gives back each one that claim's write still holds,
    /// as the SQL stores do; an effect the write never reached is left as it is.
    async fn release_claim(&self, holder: &str, now: DateTime<Utc>) -> Result<u64, DynamoError> {
        self.give_back(holder, now).await
    }

    async fn finish_effect(
        &self,
        id: i64,
        holder: &str,
        t: &TransitionColumns<'_>,
        now: DateTime<Utc>,
    ) -> Result<bool, DynamoError> {
        let token = uuid::Uuid::new_v4().to_string();
        let mut set = vec![
            "#state = :state",
            "updated_at = :now",
            "#write_token = :write_token",
        ];
        let mut remove = vec!["claimed_by", "claim_until"];
        let (k, v) = Self::effect_key(id);
        let mut req = self
            .client
            .update_item()
            .table_name(&*self.table)
            .key(k, v)
            .condition_expression("claimed_by = :h AND #state = :in_flight")
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_names("#state", "state")
            .expression_attribute_names("#write_token", WRITE_TOKEN)
            .expression_attribute_values(":write_token", s(&token))
            .expression_attribute_values(":h", s(holder))
            .expression_attribute_values(":in_flight", s("in_flight"))
            .expression_attribute_values(":state", s(t.state.as_str()))
            .expression_attribute_values(":now", s(l::ts(now)));
        if let Some(a) = t.attempts {
            set.push("attempts = :attempts");
            req = req.expression_attribute_values(":attempts", n(a));
        }
        if let Some(r) = t.reconciliations {
            set.push("reconciliations = :recs");
            req = req.expression_attribute_values(":recs", n(r));
        }
        // A due time is kept on this host's clock, as the claim reads it: as long after it as the runner
        // asked (`next_at - now`, by the runner's clock).
        let next_at = t
            .next_at
            .map(|at| txinbox_core::effects::claim_end(Utc::now(), now, at));
        if let Some(at) = next_at {
            set.push("next_at = :next");
            req = req.expression_attribute_values(":next", s(l::ts(at)));
        }
        if let Some(r) = t.reference {
            set.push("result_reference = :ref");
            req = req.expression_attribute_values(":ref", s(r));
        }
        match t.error {
            Some(e) => {
                set.push("last_error = :err");
                req = req.expression_attribute_values(":err", s(e));
            }
            None => remove.push("last_error"),
        }
        if let Some(m) = t.maybe_happened {
            set.push("maybe_happened = :maybe");
            req = req.expression_attribute_values(":maybe", AttributeValue::Bool(m));
        }
        if let Some(h) = t.sent_hash {
            set.push("sent_hash = if_not_exists(sent_hash, :sent)");
            req = req.expression_attribute_values(":sent", s(h));
        }
        // The finish is dated on this host's clock too, as the SQL stores date it on theirs (PostgreSQL's
        // `now()`, SQLite's host): the effect's item expires `effects_keep` after it, whatever the runner's
        // clock says (one days behind would leave a done effect expired, hidden and deleted at once).
        let finished = Utc::now();
        if t.finished {
            set.push("finished_at = :finished");
            req = req.expression_attribute_values(":finished", s(l::ts(finished)));
        }
        if t.state == EffectState::Done {
            let until = txinbox_core::time::after(finished, self.options.effects_keep);
            set.push("expires_at = :expires");
            req = req.expression_attribute_values(":expires", n(l::epoch_ceil(until)));
        }
        // Due again (pending, uncertain): back in the `due` index at its time; otherwise out of it.
        match (t.state, next_at) {
            (EffectState::Pending | EffectState::Uncertain, Some(at)) => {
                set.push("gsi2sk = :due");
                req = req.expression_attribute_values(":due", s(format!("{}#{id}", l::ts(at))));
            }
            _ => remove.extend(["gsi2pk", "gsi2sk"]),
        }
        let expr = format!("SET {} REMOVE {}", set.join(", "), remove.join(", "));
        match req.update_expression(expr).send().await {
            Ok(_) => Ok(true),
            // The SDK's retry of this finish, whose first attempt applied and lost its answer.
            Err(e) if own_write(&e, &token).is_some() => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(call("UpdateItem", e)),
        }
    }

    /// Done effects are deleted by the TTL (`expires_at` is set when they finish, [`DynamoOptions::effects_keep`]
    /// later): nothing to delete here.
    ///
    /// [`DynamoOptions::effects_keep`]: crate::DynamoOptions::effects_keep
    async fn purge_done_effects(
        &self,
        _before: DateTime<Utc>,
        _limit: i64,
    ) -> Result<u64, DynamoError> {
        Ok(0)
    }

    async fn effect_counts(&self) -> Result<Vec<EffectCount>, DynamoError> {
        self.effect_counts_inner().await
    }

    /// One `GetItem` by the key's id; an effect past its `expires_at` (done longer ago than
    /// [`DynamoOptions::effects_keep`](crate::DynamoOptions::effects_keep)) is absent, as everywhere.
    async fn find_effect(&self, key: &str) -> Result<Option<ClaimedEffect>, DynamoError> {
        let id = l::effect_id(key);
        let (_, v) = Self::effect_key(id);
        let Some(item) = self.get_consistent(v, &[]).await? else {
            return Ok(None);
        };
        let r = Reader::new(&item);
        if r.s("key")? != key || expired(&r, Utc::now().timestamp())? {
            return Ok(None);
        }
        let from = state_of(&r)?;
        claimed(&item, from).map(Some)
    }

    /// Conditional on the effect being done and not past its `expires_at` (absent from that second on).
    async fn mark_compensated(
        &self,
        id: i64,
        note: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, DynamoError> {
        let token = uuid::Uuid::new_v4().to_string();
        let (k, v) = Self::effect_key(id);
        let res = self
            .client
            .update_item()
            .table_name(&*self.table)
            .key(k, v)
            .update_expression(
                "SET #state = :comp, last_error = :note, updated_at = :now, #write_token = :write_token",
            )
            // Done, and not past its `expires_at` (absent from that second on).
            .condition_expression(
                "#state = :done AND (attribute_not_exists(expires_at) OR expires_at >= :epoch)",
            )
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .expression_attribute_values(":epoch", n(Utc::now().timestamp()))
            .expression_attribute_names("#state", "state")
            .expression_attribute_names("#write_token", WRITE_TOKEN)
            .expression_attribute_values(":write_token", s(&token))
            .expression_attribute_values(":comp", s("compensated"))
            .expression_attribute_values(":done", s("done"))
            .expression_attribute_values(":note", s(note))
            .expression_attribute_values(":now", s(l::ts(now)))
            .send()
            .await;
        match res {
            Ok(_) => Ok(true),
            // The SDK's retry of this compensation, whose first attempt applied and lost its answer.
            Err(e) if own_write(&e, &token).is_some() => Ok(true),
            Err(e)
                if e.as_service_error()
                    .is_some_and(|se| se.is_conditional_check_failed_exception()) =>
            {
                Ok(false)
            }
            Err(e) => Err(call("UpdateItem", e)),
        }
    }
}

impl MaintenanceStore for DynamoStore {
    type Error = DynamoError;

    /// On DynamoDB expiry is the TTL's: every item carries `expires_at`, the conditions treat an expired
    /// item as absent from that second on, and DynamoDB deletes it in the background (typically within days,
    /// at no write cost). Nothing is deleted here.
    async fn purge_batch(
        &self,
        _table: Table,
        _before: DateTime<Utc>,
        _limit: i64,
    ) -> Result<Vec<String>, DynamoError> {
        Ok(Vec::new())
    }

    /// Counts through the `by_consumer` index (a query of each of the consumer's partitions: 16 for markers,
    /// one for evidence; filtered on `expires_at`): it reads every item of those partitions, about 0.5 read
    /// unit per 4 KB read.
    async fn table_stats(
        &self,
        table: Table,
        consumer: &str,
    ) -> Result<(i64, Option<DateTime<Utc>>), DynamoError> {
        match table {
            Table::Markers => {
                self.partitions_stats(l::marker_partitions(consumer), None)
                    .await
            }
            Table::Rejections => {
                self.partition_stats(&l::rejections_of(consumer), None)
                    .await
            }
            _ => {
                let shards = (0..l::EFFECT_SHARDS).map(l::effect_shard);
                self.partitions_stats(shards, Some(consumer)).await
            }
        }
    }
}
