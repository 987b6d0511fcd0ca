//! The effect gauges, set from the store's counts after each pass.

use chrono::Utc;

use super::{EffectCount, EffectState};

/// Sets the effect gauges from `counts`: effects per consumer, destination and state (zero for a state with
/// none), the done ones without a reference from the destination, and the age of the oldest pending effect
/// (the relay lag).
pub fn publish_gauges(counts: &[EffectCount]) {
    publish_shard_gauges(counts, None, Utc::now())
}

/// [`publish_gauges`] with a `shard` label when there is one, the ages counted to `now` (the store's clock, on
/// which the effects were recorded, where it has one: see [`EffectStore::store_clock`](super::EffectStore::store_clock)).
pub(super) fn publish_shard_gauges(
    counts: &[EffectCount],
    shard: Option<&str>,
    now: chrono::DateTime<Utc>,
) {
    use crate::runtime::maintenance::shard_labels;
    use metrics::Label;
    let mut pairs: Vec<(&str, &str)> = counts
        .iter()
        .map(|c| (c.consumer.as_str(), c.destination.as_str()))
        .collect();
    pairs.sort();
    pairs.dedup();
    for (consumer, destination) in pairs {
        for state in EffectState::ALL {
            let c = counts.iter().find(|c| {
                c.consumer == consumer && c.destination == destination && c.state == state
            });
            let base = || {
                vec![
                    Label::new("consumer", consumer.to_owned()),
                    Label::new("destination", destination.to_owned()),
                ]
            };
            let mut with_state = base();
            with_state.push(Label::new("state", state.as_str()));
            metrics::gauge!(crate::metrics::EFFECTS, shard_labels(with_state, shard))
                .set(c.map_or(0.0, |c| c.count as f64));
            if state == EffectState::Done {
                metrics::gauge!(
                    crate::metrics::EFFECTS_DONE_WITHOUT_REFERENCE,
                    shard_labels(base(), shard)
                )
                .set(c.map_or(0.0, |c| c.without_reference as f64));
            }
            if state == EffectState::Pending {
                let age = c
                    .and_then(|c| c.oldest)
                    .map_or(0.0, |t| (now - t).num_milliseconds().max(0) as f64 / 1e3);
                metrics::gauge!(
                    crate::metrics::EFFECT_OLDEST_PENDING,
                    shard_labels(base(), shard)
                )
                .set(age);
            }
        }
    }
}

#[cfg(test)]
mod shard_label_tests {
    use super::*;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    /// The effect gauges of a runner on one shard of several carry a `shard` label: the runners of one
    /// consumer's shards publish a series each instead of overwriting one.
    #[test]
    fn a_shard_s_effect_gauges_carry_its_name() {
        let recorder = DebuggingRecorder::new();
        let snap = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let count = |n: i64| EffectCount {
            consumer: "crm".into(),
            destination: "api".into(),
            state: EffectState::Pending,
            count: n,
            oldest: None,
            without_reference: 0,
        };
        publish_shard_gauges(&[count(3)], Some("eu-1"), Utc::now());
        publish_shard_gauges(&[count(5)], Some("eu-2"), Utc::now());
        let pending: Vec<(Option<String>, f64)> = snap
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(k, _, _, _)| {
                k.key().name() == crate::metrics::EFFECTS
                    && k.key()
                        .labels()
                        .any(|l| l.key() == "state" && l.value() == "pending")
            })
            .map(|(k, _, _, v)| {
                let shard = k
                    .key()
                    .labels()
                    .find(|l| l.key() == "shard")
                    .map(|l| l.value().to_owned());
                let v = match v {
                    DebugValue::Gauge(g) => g.into_inner(),
                    _ => f64::NAN,
                };
                (shard, v)
            })
            .collect();
        let mut pending = pending;
        pending.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            pending,
            vec![(Some("eu-1".into()), 3.0), (Some("eu-2".into()), 5.0)]
        );
    }
}
