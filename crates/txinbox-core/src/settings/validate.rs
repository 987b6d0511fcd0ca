use std::time::Duration;

use super::{SettingsError, WorkerSettings};

impl WorkerSettings {
    pub(super) fn validate(&self, origin: &str) -> Result<(), SettingsError> {
        let bad = |key: &'static str, detail: String| {
            Err(SettingsError::Value {
                key,
                origin: origin.to_owned(),
                detail,
            })
        };
        if let Some(h) = self.sqs.heartbeat_interval_seconds {
            let derived = self.sqs.heartbeat_interval();
            if Duration::from_secs(h) != derived {
                return bad(
                    "sqs.heartbeat_interval_seconds",
                    format!(
                        "{h} s, but the worker extends the visibility every third of visibility_timeout_seconds ({} s = {derived:?}): remove the key or set it to that",
                        self.sqs.visibility_timeout_seconds
                    ),
                );
            }
        }
        if let Some(r) = self.servicebus.lock_renewal_interval_seconds {
            let derived = self.servicebus.lock_renewal_interval();
            if Duration::from_secs(r) != derived {
                return bad(
                    "servicebus.lock_renewal_interval_seconds",
                    format!(
                        "{r} s, but the worker renews the lock every third of lock_duration_seconds ({} s = {derived:?}): remove the key or set it to that",
                        self.servicebus.lock_duration_seconds
                    ),
                );
            }
        }
        if self.store.shards.is_empty() && self.store.require_all_shards {
            return bad(
                "store.require_all_shards",
                "set without [store.shards]: it says whether a worker on shards may start without one of them, and there are none; remove it, or describe the shards".into(),
            );
        }
        if !self.store.shards.is_empty() {
            // The worker and the operator commands never use it with shards: one given anyway (in the file,
            // or by TXINBOX_STORE__URL) is a store someone expects to be used.
            if self.store.url != super::StoreSettings::default().url {
                return bad(
                    "store.url",
                    "set with [store.shards]: a worker on shards uses each shard's url and never this one; remove it (or TXINBOX_STORE__URL)".into(),
                );
            }
            for (name, shard) in &self.store.shards {
                match (&shard.url, &shard.url_env) {
                    (Some(_), Some(_)) => {
                        return bad(
                            "store.shards",
                            format!("shard {name:?} sets both url and url_env: keep one"),
                        )
                    }
                    (None, None) => {
                        return bad(
                            "store.shards",
                            format!("shard {name:?} has no url and no url_env"),
                        )
                    }
                    (Some(url), None) if !super::store::is_postgres_url(url) => {
                        return bad(
                            "store.shards",
                            format!(
                                "shard {name:?}: shards are PostgreSQL stores (postgres://...)"
                            ),
                        )
                    }
                    _ => {}
                }
            }
            if let Err(e) = crate::runtime::shards::check_shards(
                self.store
                    .shards
                    .iter()
                    .map(|(n, s)| (n.as_str(), s.tenants.as_slice(), s.rest)),
            ) {
                return bad("store.shards", e.to_string());
            }
        }
        if self.worker.concurrency == 0 {
            return bad("worker.concurrency", "must be at least 1".into());
        }
        if self.worker.receive_max == Some(0) {
            return bad("worker.receive_max", "must be at least 1".into());
        }
        if !(1..=crate::runtime::worker::MAX_BATCH_COMMIT).contains(&self.worker.batch_commit) {
            return bad(
                "worker.batch_commit",
                format!(
                    "{} is outside 1..={} (PostgreSQL keeps at most 64 subtransactions in shared memory)",
                    self.worker.batch_commit,
                    crate::runtime::worker::MAX_BATCH_COMMIT
                ),
            );
        }
        if let Some(n) = self.worker.receive_loops {
            if !(1..=crate::runtime::worker::MAX_RECEIVE_LOOPS).contains(&n) {
                return bad(
                    "worker.receive_loops",
                    format!(
                        "{n} is outside 1..={} (unset: the worker chooses)",
                        crate::runtime::worker::MAX_RECEIVE_LOOPS
                    ),
                );
            }
        }
        let linger_max = crate::runtime::worker::MAX_BATCH_LINGER.as_millis() as u64;
        if self.worker.batch_linger_ms > linger_max {
            return bad(
                "worker.batch_linger_ms",
                format!(
                    "{} is above {linger_max} (a larger receive_max gathers a batch better than a longer wait)",
                    self.worker.batch_linger_ms
                ),
            );
        }
        if self.worker.batch_linger_ms > 0 && self.worker.batch_commit == 1 {
            return bad(
                "worker.batch_linger_ms",
                format!(
                    "{} ms with batch_commit = 1: a linger gathers a batch, and without batch commit there is none (set batch_commit above 1, or remove the key)",
                    self.worker.batch_linger_ms
                ),
            );
        }
        // The runtime would raise these to their floor without a word: refused instead, so the value in the
        // file is the value run.
        let e = &self.effects;
        for (key, at_least_one) in [
            ("effects.batch", e.batch >= 1),
            ("effects.claim_seconds", e.claim_seconds >= 1),
            ("effects.max_attempts", e.max_attempts >= 1),
            ("effects.max_reconciliations", e.max_reconciliations >= 1),
            (
                "worker.purge_interval_seconds",
                self.worker.purge_interval_seconds != Some(0),
            ),
        ] {
            if !at_least_one {
                return bad(key, "must be at least 1".into());
            }
        }
        if u128::from(self.effects.max_backoff_seconds) * 1000 < u128::from(self.effects.backoff_ms)
        {
            return bad(
                "effects.max_backoff_seconds",
                format!(
                    "{} s is below backoff_ms ({} ms): the longest pause cannot be shorter than the first",
                    self.effects.max_backoff_seconds, self.effects.backoff_ms
                ),
            );
        }
        if let Some((name, _)) = self
            .store
            .shards
            .iter()
            .find(|(_, s)| s.max_connections == Some(0))
        {
            return bad(
                "store.shards",
                format!("shard {name:?}: max_connections must be at least 1"),
            );
        }
        if self.store.max_connections == 0 {
            return bad("store.max_connections", "must be at least 1".into());
        }
        if let Err(e) = crate::ConsumerName::new(&self.worker.consumer) {
            // The rule broken, without the name: it may come from an environment override.
            let rule = match e {
                crate::BadInput::InvalidConsumerName { reason, .. } => reason,
                _ => "not a valid consumer name",
            };
            return bad(
                "worker.consumer",
                format!("not a valid consumer name: {rule}"),
            );
        }
        for (key, addr) in [
            ("worker.health_addr", &self.worker.health_addr),
            ("worker.metrics_addr", &self.worker.metrics_addr),
        ] {
            if let Some(a) = addr {
                if a.parse::<std::net::SocketAddr>().is_err() {
                    return bad(key, format!("`{a}` is not an address like 0.0.0.0:8080"));
                }
            }
        }
        Ok(())
    }
}
