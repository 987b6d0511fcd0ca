//! The commit: one `TransactWriteItems` call with its retries, and the classification of a cancelled one.

use std::collections::{BTreeMap, BTreeSet, HashSet};

use aws_sdk_dynamodb::types::{
    AttributeValue, Put, ReturnValuesOnConditionCheckFailure, TransactWriteItem,
};
use chrono::Utc;
use txinbox_core::store::Commit;
use txinbox_core::{HandlerError, Retry};

use super::limits::{action_table, check_item_sizes, check_limits, check_total_size};
use super::DynamoStore;
use crate::error::call;
use crate::layout::{self as l, n, s, Item, Reader};
use crate::tx::{DynamoTx, Pending};
use crate::DynamoError;

impl DynamoStore {
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

    /// The conditional put of a marker: [`Self::absent_or_expired`], except that a marker written under one
    /// of `unsure`, the tokens of this commit's earlier attempts that may have committed (their answer was
    /// lost), is never absent, even past its `expires_at`: its condition fails on it, and the commit is found
    /// done by its token, rather than written a second time because its retention ran out meanwhile.
    fn marker_put(&self, item: Item, unsure: &[String]) -> Result<TransactWriteItem, DynamoError> {
        if unsure.is_empty() {
            return self.absent_or_expired(item);
        }
        // `IN` takes at most 100 operands: the latest attempts (an earlier one that committed is met, not
        // expired, by the attempt after it).
        let unsure = &unsure[unsure.len().saturating_sub(100)..];
        let names: Vec<String> = (0..unsure.len()).map(|i| format!(":t{i}")).collect();
        let mut put = Put::builder()
            .table_name(&*self.table)
            .set_item(Some(item))
            .condition_expression(format!(
                "attribute_not_exists(pk) OR (expires_at < :now AND NOT (#token IN ({})))",
                names.join(", ")
            ))
            .expression_attribute_names("#token", "token")
            .expression_attribute_values(":now", n(Self::now_epoch()))
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld);
        for (name, token) in names.iter().zip(unsure) {
            put = put.expression_attribute_values(name, s(token));
        }
        Ok(TransactWriteItem::builder().put(put.build()?).build())
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

    pub(super) async fn commit_inner(&self, tx: DynamoTx) -> Result<Commit, DynamoError> {
        let (pending, actions) = {
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
        let sole = match pending.as_slice() {
            [p] => Some(p.marker.identity.clone()),
            _ => None,
        };
        let answer = self.send_all(pending, actions).await?;
        // A transaction refused for good (over the service's limits, or invalid) says nothing of the marker:
        // DynamoDB decides duplicates at commit, in the same call. A copy of a message applied before is
        // decided by the marker it meets, as a commit-time conflict would be and as a store that checks the
        // marker first decides it: the marker (or the business key item) is read once, on this path only. A
        // batch's refusal needs no read: the pipeline then sends each delivery alone.
        match (answer, sole) {
            (Commit::HandlerFailed(e), Some(identity)) if e.retry_kind() == Retry::No => {
                Ok(match self.live_holder(&identity).await? {
                    Some(holder) => {
                        tracing::debug!(error = %e, "commit: refused for good, but the message's marker or business key is held: decided by its holder");
                        Commit::Conflict(Some(holder))
                    }
                    None => Commit::HandlerFailed(e),
                })
            }
            (answer, _) => Ok(answer),
        }
    }

    /// The commit of `pending` and the handler's `actions`, as [`Self::commit_inner`] answers it before a
    /// permanent refusal is looked at.
    async fn send_all(
        &self,
        mut pending: Vec<Pending>,
        actions: Vec<TransactWriteItem>,
    ) -> Result<Commit, DynamoError> {
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
        // Each effect's group tail key, worked out once: by delivery, then by effect.
        let effect_groups: Vec<Vec<Option<String>>> = pending
            .iter()
            .map(|p| p.effects.iter().map(group_tail_of).collect())
            .collect();
        let groups: BTreeSet<String> = effect_groups.iter().flatten().flatten().cloned().collect();
        let share: usize = pending
            .iter()
            .map(|p| 1 + usize::from(p.marker.identity.business_key.is_some()) + p.effects.len())
            .sum::<usize>()
            + groups.len();
        if let Err(e) = check_limits(&actions, share) {
            return Ok(Commit::HandlerFailed(HandlerError::permanent(e)));
        }
        let mut tokens: Vec<String> = Vec::new();
        // The tokens of the attempts whose answer was lost (a timeout, a 5xx, a transaction in progress):
        // they may have committed. An attempt answered with a cancellation or a refusal wrote nothing.
        let mut unsure: Vec<String> = Vec::new();
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let token = uuid::Uuid::new_v4().to_string();
            tokens.push(token.clone());
            // What each of the store's items stands for, by its position in the call.
            let mut slots = Vec::with_capacity(share);
            let mut items = Vec::with_capacity(share + actions.len());
            // Each group's tail as it is now: the effects of this transaction chain on from it.
            let mut tails = self.group_tails(&groups).await?;
            let seen = tails.clone();
            for (i, p) in pending.iter().enumerate() {
                let reference = p.result_reference.as_deref();
                items.push(
                    self.marker_put(Self::marker_item(&p.marker, reference, &token), &unsure)?,
                );
                slots.push(Slot::Marker);
                if let Some(k) = &p.marker.identity.business_key {
                    items.push(
                        self.absent_or_expired(Self::business_item(&p.marker, k, reference))?,
                    );
                    slots.push(Slot::BusinessKey);
                }
                for (j, e) in p.effects.iter().enumerate() {
                    let mut e = e.clone();
                    if let Some(tail) = effect_groups[i][j].as_ref().and_then(|g| tails.get_mut(g))
                    {
                        // The tail may name the expired item this effect replaces (same key): nothing
                        // before it then.
                        if let Some(prev) = tail.replace(e[l::PK].clone()) {
                            if prev != e[l::PK] {
                                e.insert("prev".into(), prev);
                            }
                        }
                    }
                    // Absent, or past its `expires_at` (a done effect the TTL has not deleted yet, absent for
                    // every read): an effect recorded again after its message's marker expired replaces it.
                    let put = Put::builder()
                        .table_name(&*self.table)
                        .set_item(Some(e))
                        .condition_expression("attribute_not_exists(pk) OR expires_at < :now")
                        .expression_attribute_values(":now", n(Self::now_epoch()))
                        .build()?;
                    items.push(TransactWriteItem::builder().put(put).build());
                    slots.push(Slot::Effect(i, j));
                }
            }
            for (group, tail) in &tails {
                let Some(tail) = tail else { continue };
                items.push(self.group_tail_put(group, tail.clone(), seen[group].clone())?);
                slots.push(Slot::GroupTail);
            }
            let first_action = items.len();
            items.extend(actions.iter().cloned());
            if let Err(e) = check_item_sizes(&items, first_action).and(check_total_size(&items)) {
                return Ok(Commit::HandlerFailed(HandlerError::permanent(e)));
            }
            let err = match self.send(items, &token).await {
                Ok(()) => return Ok(Commit::Done),
                Err(e) => e,
            };
            let last = attempt >= self.options.commit_attempts;
            let reasons = cancellation_reasons(&err);
            let Some(reasons) = reasons else {
                if is_validation(&err) {
                    // The request itself is invalid (two actions on one item that the check before sending
                    // could not see, say): the same transaction would be refused again.
                    let refused = match call("TransactWriteItems", err) {
                        DynamoError::Call {
                            message, source, ..
                        } => DynamoError::Refused {
                            message,
                            source: Some(source),
                        },
                        other => other,
                    };
                    return Ok(Commit::HandlerFailed(HandlerError::permanent(refused)));
                }
                let e = call("TransactWriteItems", err);
                if e.is_transient() && !last {
                    unsure.push(token);
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
                .find(|(i, slot)| matches!(slot, Slot::Marker | Slot::BusinessKey) && refused(*i))
            {
                return Ok(Commit::Conflict(
                    reasons[i]
                        .item()
                        .map(|item| Self::holder(item, *slot == Slot::Marker))
                        .transpose()?,
                ));
            }
            // Another commit recorded effects of one of these groups since its tail was read: chain on from
            // the new tail.
            if slots
                .iter()
                .enumerate()
                .any(|(i, slot)| *slot == Slot::GroupTail && refused(i))
                && !last
                && slots
                    .iter()
                    .enumerate()
                    .all(|(i, slot)| *slot == Slot::GroupTail || !refused(i))
            {
                tracing::debug!(
                    attempt,
                    "commit: a group's tail moved, trying again from the new one"
                );
                self.pause(attempt).await;
                continue;
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
            // One of the store's own items refused as invalid: permanent, as for the handler's.
            if let Some(r) = reasons
                .iter()
                .take(first_action)
                .find(|r| r.code() == Some("ValidationError"))
            {
                return Ok(Commit::HandlerFailed(HandlerError::permanent(
                    DynamoError::Refused {
                        message: format!(
                            "ValidationError on the store's own item: {}",
                            r.message().unwrap_or("no reason given")
                        ),
                        source: None,
                    },
                )));
            }
            // Only the reasons of the call's actions: an answer with more (a proxy's or an emulator's fault)
            // is the commit's error below, naming them by position.
            for (i, r) in reasons
                .iter()
                .enumerate()
                .skip(first_action)
                .take(actions.len())
            {
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
            // DynamoDB's message lists the codes by position; which of the store's items or the handler's
            // actions each position is, is the store's to say.
            let named = describe_reasons(&reasons, &slots, &actions, first_action);
            return Err(match e {
                DynamoError::Call {
                    op,
                    message,
                    source,
                    ..
                } => DynamoError::Call {
                    op,
                    transient,
                    message: format!("{message} ({named})"),
                    source,
                },
                other => other,
            });
        }
    }
}

/// Every reason of a cancellation but `None`, each named by what it stands for: one of the store's items
/// (`slots`, in the call's order) or the handler's action at `first_action` on.
fn describe_reasons(
    reasons: &[aws_sdk_dynamodb::types::CancellationReason],
    slots: &[Slot],
    actions: &[TransactWriteItem],
    first_action: usize,
) -> String {
    let named: Vec<String> = reasons
        .iter()
        .enumerate()
        .filter_map(|(i, r)| {
            let code = r.code().unwrap_or("no code");
            if code == "None" {
                return None;
            }
            let what = match (slots.get(i), i.checked_sub(first_action)) {
                (Some(Slot::Marker), _) => "the marker".to_owned(),
                (Some(Slot::BusinessKey), _) => "the business key item".to_owned(),
                (Some(Slot::Effect(p, e)), _) => format!("effect {e} of delivery {p}"),
                (Some(Slot::GroupTail), _) => "a group's tail item".to_owned(),
                (None, Some(k)) if k < actions.len() => format!(
                    "the handler's action {k} (table {})",
                    action_table(&actions[k])
                ),
                _ => format!("action {i} of the call"),
            };
            Some(match r.message() {
                Some(m) => format!("{what}: {code}: {m}"),
                None => format!("{what}: {code}"),
            })
        })
        .collect();
    if named.is_empty() {
        "no reason given".to_owned()
    } else {
        named.join("; ")
    }
}

/// What one of the store's items in a `TransactWriteItems` call stands for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Marker,
    BusinessKey,
    /// The effect `.1` of the delivery `.0`.
    Effect(usize, usize),
    /// A group's tail item.
    GroupTail,
}

/// The key of the tail item of an effect item's group, if it has one.
fn group_tail_of(e: &Item) -> Option<String> {
    let r = Reader::new(e);
    let group = r.opt_s("group_key").ok()??;
    let consumer = r.opt_s("consumer").ok()??;
    Some(l::group_tail_pk(&consumer, &group))
}

impl DynamoStore {
    /// The tail of each of `groups` (their tail items' keys), read strongly consistent (`None`: the group
    /// has no effect yet).
    async fn group_tails(
        &self,
        groups: &BTreeSet<String>,
    ) -> Result<BTreeMap<String, Option<AttributeValue>>, DynamoError> {
        let mut tails = BTreeMap::new();
        for group in groups {
            let out = self.get_consistent(s(group), &["tail"]).await?;
            tails.insert(group.clone(), out.and_then(|mut i| i.remove("tail")));
        }
        Ok(tails)
    }

    /// The put of a group's tail item naming `tail`, on the condition that it still names `seen`.
    fn group_tail_put(
        &self,
        group: &str,
        tail: AttributeValue,
        seen: Option<AttributeValue>,
    ) -> Result<TransactWriteItem, DynamoError> {
        let mut put = Put::builder()
            .table_name(&*self.table)
            .item(l::PK, s(group))
            .item("kind", s("group_tail"))
            .item("tail", tail);
        put = match seen {
            None => put.condition_expression("attribute_not_exists(pk)"),
            Some(v) => put
                .condition_expression("tail = :seen")
                .expression_attribute_values(":seen", v),
        };
        Ok(TransactWriteItem::builder().put(put.build()?).build())
    }
}

/// Whether DynamoDB refused the call as invalid (`ValidationException`), not cancelled it.
fn is_validation<R>(
    e: &aws_sdk_dynamodb::error::SdkError<
        aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError,
        R,
    >,
) -> bool {
    use aws_sdk_dynamodb::error::ProvideErrorMetadata;
    e.as_service_error()
        .is_some_and(|se| se.code() == Some("ValidationException"))
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
