//! The operator queries, written once over [`OpsDb`], and the inherent methods that call them.

use chrono::{DateTime, Utc};

use super::rows::{effect_from, marker_from, rejection_from, Cols, OpsDb};
use super::sql::{
    consumers_sql, marker_sql, message_effects_sql, message_rejections_sql, rejections_sql, Param,
    EFFECT_STATS, INBOX_STATS, REJECTION_STATS,
};
use super::{
    ConsumerStats, EffectView, MarkerView, MessageStory, RejectionFilter, RejectionRow,
    MAX_CONSUMERS, WAITING_EFFECT_STATES,
};

pub(super) async fn consumer_stats<S: OpsDb>(
    db: &S,
    consumer: Option<&str>,
    now: DateTime<Utc>,
) -> Result<Vec<ConsumerStats>, sqlx::Error> {
    let consumers: Vec<String> = match consumer {
        Some(c) => vec![c.to_owned()],
        None => {
            let mut all = std::collections::BTreeSet::new();
            for table in ["txinbox_inbox", "txinbox_rejections", "txinbox_effects"] {
                let sql = consumers_sql(table);
                let params = [Param::Int(MAX_CONSUMERS)];
                let mut rows = db.fetch(&sql, &params).await?;
                if table == "txinbox_inbox" {
                    rows.extend(db.fetch_legacy(&sql, &params).await?);
                }
                for r in rows {
                    all.insert(r.text(0)?);
                }
            }
            all.into_iter().take(MAX_CONSUMERS as usize).collect()
        }
    };
    // Saturated: `now` is the caller's, the earliest date there is included.
    let hour_ago = txinbox_core::time::before(now, std::time::Duration::from_secs(3600));
    let mut out = Vec::with_capacity(consumers.len());
    for c in consumers {
        let mut s = ConsumerStats::new(c.clone(), now);
        let name = Param::Text(c);
        let params = [name.clone(), Param::Time(hour_ago)];
        let mut rows = db.fetch(INBOX_STATS, &params).await?;
        rows.extend(db.fetch_legacy(INBOX_STATS, &params).await?);
        for r in &rows {
            let (oldest, newest) = (r.opt_time(1)?, r.opt_time(2)?);
            s.inbox_rows += r.int(0)?;
            s.oldest_processed_at = match (s.oldest_processed_at, oldest) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            s.newest_processed_at = s.newest_processed_at.max(newest);
            s.rows_last_hour += r.int(3)?;
        }
        for r in db
            .fetch(REJECTION_STATS, std::slice::from_ref(&name))
            .await?
        {
            s.rejections.insert(r.text(0)?, r.int(1)?);
            s.last_rejection_at = s.last_rejection_at.max(r.opt_time(2)?);
        }
        for r in db.fetch(EFFECT_STATS, std::slice::from_ref(&name)).await? {
            let state = r.text(0)?;
            let oldest = r.opt_time(2)?;
            if WAITING_EFFECT_STATES.contains(&state.as_str()) {
                if let Some(t) = oldest {
                    s.oldest_pending_effect_at =
                        Some(s.oldest_pending_effect_at.map_or(t, |o| o.min(t)));
                }
            }
            s.effects.insert(state, r.int(1)?);
        }
        s.effect_lag_seconds = s
            .oldest_pending_effect_at
            .map(|t| (now - t).num_milliseconds().max(0) as f64 / 1000.0);
        out.push(s);
    }
    Ok(out)
}

pub(super) async fn message_story<S: OpsDb>(
    db: &S,
    consumer: &str,
    message_id: &str,
    source: Option<&str>,
) -> Result<MessageStory, sqlx::Error> {
    let mut params = vec![
        Param::Text(consumer.to_owned()),
        Param::Text(message_id.to_owned()),
    ];
    if let Some(s) = source {
        params.push(Param::Text(s.to_owned()));
    }
    let sql = marker_sql(source.is_some());
    let mut rows = db.fetch(&sql, &params).await?;
    let legacy = db.fetch_legacy(&sql, &params).await?;
    let sort = !legacy.is_empty();
    rows.extend(legacy);
    let mut markers: Vec<MarkerView> = rows.iter().map(marker_from).collect::<Result<_, _>>()?;
    if sort {
        // One per source: a marker of the frozen table is never also in the partitioned one.
        markers.sort_by(|a, b| a.source.cmp(&b.source));
    }
    let mut rejections: Vec<RejectionRow> = db
        .fetch(&message_rejections_sql(source.is_some()), &params)
        .await?
        .iter()
        .map(rejection_from)
        .collect::<Result<_, _>>()?;
    rejections.sort_by(|a, b| (a.recorded_at, &a.id).cmp(&(b.recorded_at, &b.id)));
    let mut effects: Vec<EffectView> = db
        .fetch(&message_effects_sql(), &params[..2])
        .await?
        .iter()
        .map(effect_from)
        .collect::<Result<_, _>>()?;
    effects.sort_by_key(|e| e.id);
    Ok(MessageStory {
        consumer: consumer.to_owned(),
        message_id: message_id.to_owned(),
        source: source.map(str::to_owned),
        markers,
        rejections,
        effects,
    })
}

pub(super) async fn rejections<S: OpsDb>(
    db: &S,
    filter: &RejectionFilter,
) -> Result<Vec<RejectionRow>, sqlx::Error> {
    let (sql, params) = rejections_sql(filter);
    db.fetch(&sql, &params)
        .await?
        .iter()
        .map(rejection_from)
        .collect()
}

/// The inherent methods, the same on both backends.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
macro_rules! ops_methods {
    () => {
        /// Per-consumer figures (one consumer, or every consumer found in the inbox, rejection and effect
        /// tables); `now` is the reference of the last hour and of the effect lag.
        pub async fn consumer_stats(
            &self,
            consumer: Option<&str>,
            now: DateTime<Utc>,
        ) -> Result<Vec<ConsumerStats>, sqlx::Error> {
            consumer_stats(self, consumer, now).await
        }

        /// One message's story: its markers (one per source unless `source` is given), rejections and
        /// effects. Check [`MessageStory::found`].
        pub async fn message_story(
            &self,
            consumer: &str,
            message_id: &str,
            source: Option<&str>,
        ) -> Result<MessageStory, sqlx::Error> {
            message_story(self, consumer, message_id, source).await
        }

        /// Rejections matching `filter`, newest first.
        pub async fn rejections(
            &self,
            filter: &RejectionFilter,
        ) -> Result<Vec<RejectionRow>, sqlx::Error> {
            rejections(self, filter).await
        }
    };
}

#[cfg(any(feature = "postgres", feature = "sqlite"))]
pub(super) use ops_methods;
