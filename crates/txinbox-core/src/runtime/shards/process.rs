use std::future::Future;

use futures::future::join_all;
use futures::FutureExt;

use super::{lock, Route, Shards, NO_SHARD};
use crate::broker::{DeadLetter, Delivery};
use crate::metrics as m;
use crate::pipeline::outcome::Outcome;
use crate::runtime::worker::Processor;
use crate::CancellationToken;

impl<P, D> Processor<D> for Shards<P>
where
    P: Processor<D>,
    D: Delivery,
{
    fn consumer(&self) -> &str {
        self.inner.processors[0].consumer()
    }

    fn started(&self) {
        let consumer = self.inner.processors[0].consumer().to_owned();
        let _ = self.inner.consumer.set(consumer.clone());
        for p in &self.inner.processors {
            p.started();
        }
        for w in self.inner.watch.iter() {
            let labels = [
                ("consumer", consumer.clone()),
                ("shard", w.name.to_string()),
            ];
            metrics::counter!(m::SHARD_UNAVAILABLE, &labels).increment(0);
            metrics::gauge!(m::SHARD_UP, &labels).set(if lock(&w.down).is_none() {
                1.0
            } else {
                0.0
            });
        }
        metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => NO_SHARD)
            .increment(0);
        self.start_probes(&consumer);
    }

    fn process(
        &self,
        delivery: D,
        stop: CancellationToken,
    ) -> impl Future<Output = Outcome> + Send {
        let this = self.clone();
        async move {
            match this.route(delivery.message()) {
                Route::Shard(i) => {
                    let outcome = this.inner.processors[i].process(delivery, stop).await;
                    if matches!(outcome, Outcome::Retry { .. }) {
                        this.probe_soon(i, this.inner.processors[0].consumer());
                    }
                    outcome
                }
                Route::Down(i, why) => this.unavailable(delivery, i, &why).await,
                Route::Nowhere(why) => this.nowhere(delivery, why).await,
            }
        }
        .boxed()
    }

    fn process_batch(
        &self,
        deliveries: Vec<D>,
        stop: CancellationToken,
    ) -> impl Future<Output = Vec<Outcome>> + Send {
        let this = self.clone();
        async move {
            let n = deliveries.len();
            let mut groups: Vec<(Vec<usize>, Vec<D>)> = (0..this.inner.processors.len())
                .map(|_| Default::default())
                .collect();
            let mut elsewhere = Vec::new();
            for (at, d) in deliveries.into_iter().enumerate() {
                match this.route(d.message()) {
                    Route::Shard(i) => {
                        groups[i].0.push(at);
                        groups[i].1.push(d);
                    }
                    other => elsewhere.push((at, d, other)),
                }
            }
            let mut out: Vec<Option<Outcome>> = (0..n).map(|_| None).collect();
            let batches = groups
                .into_iter()
                .enumerate()
                .filter(|(_, g)| !g.1.is_empty())
                .map(|(i, (at, ds))| {
                    let this = this.clone();
                    let stop = stop.clone();
                    async move {
                        let outcomes = this.inner.processors[i].process_batch(ds, stop).await;
                        if outcomes.iter().any(|o| matches!(o, Outcome::Retry { .. })) {
                            this.probe_soon(i, this.inner.processors[0].consumer());
                        }
                        (at, outcomes)
                    }
                });
            let others = elsewhere.into_iter().map(|(at, d, route)| {
                let this = this.clone();
                async move {
                    let o = match route {
                        Route::Down(i, why) => this.unavailable(d, i, &why).await,
                        Route::Nowhere(why) => this.nowhere(d, why).await,
                        Route::Shard(_) => unreachable_route(),
                    };
                    (at, o)
                }
            });
            let (batches, others) = futures::join!(join_all(batches), join_all(others));
            for (at, outcomes) in batches {
                for (a, o) in at.into_iter().zip(outcomes) {
                    out[a] = Some(o);
                }
            }
            for (a, o) in others {
                out[a] = Some(o);
            }
            out.into_iter()
                .map(|o| {
                    o.unwrap_or_else(|| Outcome::Retry {
                        reason: "a shard answered fewer outcomes than it was given deliveries"
                            .into(),
                    })
                })
                .collect()
        }
        .boxed()
    }
}

/// Deliveries routed to a shard are batched, never decided here.
fn unreachable_route() -> Outcome {
    Outcome::Retry {
        reason: "internal: a routed delivery was decided outside its shard".into(),
    }
}

impl<P> Shards<P> {
    fn consumer_of<D: Delivery>(&self) -> String
    where
        P: Processor<D>,
    {
        self.inner.processors[0].consumer().to_owned()
    }

    async fn unavailable<D: Delivery>(&self, delivery: D, i: usize, why: &str) -> Outcome
    where
        P: Processor<D>,
    {
        let consumer = self.consumer_of::<D>();
        let shard = self.inner.watch[i].name.to_string();
        metrics::counter!(m::SHARD_UNAVAILABLE, "consumer" => consumer.clone(), "shard" => shard.clone())
            .increment(1);
        metrics::counter!(m::RETRIES, "consumer" => consumer.clone(), "reason" => "shard_unavailable")
            .increment(1);
        let delay = self
            .opts()
            .unavailable_delay(delivery.message().delivery_count);
        if let Err(e) = delivery.release(delay).await {
            metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => "release")
                .increment(1);
            tracing::warn!(op = "release", error = %e, "settle failed; the broker will redeliver");
        }
        Outcome::Retry {
            reason: format!("shard {shard} is unavailable: {why}"),
        }
    }

    async fn nowhere<D: Delivery>(&self, delivery: D, why: String) -> Outcome
    where
        P: Processor<D>,
    {
        let consumer = self.consumer_of::<D>();
        tracing::warn!(reason = NO_SHARD, detail = %why, "no shard takes this delivery: dead-lettering");
        metrics::counter!(m::DEAD_LETTERS, "consumer" => consumer.clone(), "reason" => NO_SHARD)
            .increment(1);
        if let Err(e) = delivery
            .dead_letter(DeadLetter::new(NO_SHARD, why.clone()))
            .await
        {
            metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => "dead_letter")
                .increment(1);
            tracing::warn!(op = "dead_letter", error = %e, "settle failed; the broker will redeliver");
        }
        Outcome::DeadLettered {
            reason: NO_SHARD.into(),
            detail: why,
        }
    }
}
