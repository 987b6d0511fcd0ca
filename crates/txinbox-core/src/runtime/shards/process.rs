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

    /// The shards of two consumers (one worker is one consumer: its metrics, its shards' series and its
    /// readiness carry one consumer name), a shard whose processor refuses to run (its line, the shard named),
    /// or shards whose checks were refused by a readiness ([`Shards::health`]).
    fn refused(&self) -> Option<String> {
        let first = self.inner.processors[0].consumer();
        if let Some(i) = self
            .inner
            .processors
            .iter()
            .position(|p| p.consumer() != first)
        {
            return Some(format!(
                "shard {:?} is of consumer {first:?} and shard {:?} of consumer {:?}: the shards of one worker must be of one consumer; give each consumer its own Shards and worker",
                &*self.inner.watch[0].name,
                &*self.inner.watch[i].name,
                self.inner.processors[i].consumer(),
            ));
        }
        if let Some((i, why)) = self
            .inner
            .processors
            .iter()
            .enumerate()
            .find_map(|(i, p)| p.refused().map(|why| (i, why)))
        {
            return Some(format!(
                "shard {:?} cannot run: {why}",
                &*self.inner.watch[i].name
            ));
        }
        lock(&self.inner.refused).clone()
    }

    /// The largest of the shards' limits, when each has one: a larger body is refused by every shard.
    fn max_payload_bytes(&self) -> Option<usize> {
        self.widest::<D>().map(|(_, limit)| limit)
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
            match this.route_checked::<D>(delivery.message()) {
                Route::Shard(i) => {
                    let outcome = this.inner.processors[i].process(delivery, stop).await;
                    if matches!(outcome, Outcome::Retry { .. }) {
                        this.probe_soon(i, this.inner.processors[0].consumer());
                    }
                    outcome
                }
                Route::Down(i, why) => this.unavailable(delivery, i, &why).await,
                Route::Nowhere(why) => this.nowhere(delivery, why).await,
                Route::TooLarge(i) => this.inner.processors[i].process(delivery, stop).await,
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
                match this.route_checked::<D>(d.message()) {
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
                let stop = stop.clone();
                async move {
                    let o = match route {
                        Route::Down(i, why) => this.unavailable(d, i, &why).await,
                        Route::Nowhere(why) => this.nowhere(d, why).await,
                        Route::TooLarge(i) => this.inner.processors[i].process(d, stop).await,
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
    /// The shard whose processor accepts the largest body, and that size, when every shard's processor
    /// refuses a larger one itself ([`Processor::max_payload_bytes`]); `None` when one of them has no limit.
    fn widest<D: Delivery>(&self) -> Option<(usize, usize)>
    where
        P: Processor<D>,
    {
        let mut widest: Option<(usize, usize)> = None;
        for (i, p) in self.inner.processors.iter().enumerate() {
            let limit = p.max_payload_bytes()?;
            if widest.is_none_or(|(_, most)| limit > most) {
                widest = Some((i, limit));
            }
        }
        widest
    }

    /// Where `msg` goes, its size checked before the router reads it: a body every shard refuses goes, unread,
    /// to the shard with the largest limit, which refuses it as a worker on one store would (dead-lettered
    /// `payload_too_large`, its store untouched). The router (a structured CloudEvent's tenant is in its JSON
    /// body) never parses more than a shard accepts.
    fn route_checked<D: Delivery>(&self, msg: &crate::ReceivedMessage) -> Route
    where
        P: Processor<D>,
    {
        match self.widest::<D>() {
            Some((i, limit)) if msg.body.len() > limit => Route::TooLarge(i),
            _ => self.route(msg),
        }
    }

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
        let holds = delivery.release_holds();
        metrics::counter!(m::SHARD_UNAVAILABLE, "consumer" => consumer.clone(), "shard" => shard.clone())
            .increment(1);
        metrics::counter!(m::RETRIES, "consumer" => consumer.clone(), "reason" => "shard_unavailable")
            .increment(1);
        let delay = self
            .opts()
            .unavailable_delay(delivery.message().delivery_count);
        let release = async move {
            if let Err(e) = delivery.release(delay).await {
                metrics::counter!(m::SETTLE_FAILURES, "consumer" => consumer, "op" => "release")
                    .increment(1);
                tracing::warn!(op = "release", error = %e, "settle failed; the broker will redeliver");
            }
        };
        // A release that holds its caller for the delay (Service Bus) waits it out in the background, so that
        // the down shard's deliveries do not take the worker slots of the shards that are up; past
        // MAX_BACKGROUND_RELEASES it waits in its slot. A background release dropped with the process leaves
        // the lock to lapse: the message comes back then, a little later than the delay said.
        match holds
            .then(|| self.inner.releasing.clone().try_acquire_owned().ok())
            .flatten()
        {
            Some(permit) => {
                tokio::spawn(async move {
                    release.await;
                    drop(permit);
                });
            }
            None => release.await,
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
