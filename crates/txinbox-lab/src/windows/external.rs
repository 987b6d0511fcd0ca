//! The external-call windows: an effect's call whose answer is lost, that never reached the destination, or
//! whose key the destination is still processing, against the local CRM API in the shapes public APIs
//! answer in. Each window checks the effect's end state, the tasks at the destination (one, never two, never
//! none) and what the runner did.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use txinbox_core::broker::mem::{MemoryQueue, QueueState};
use txinbox_core::effects::{
    BoxError, BoxFuture, ClaimedEffect, Confirmation, EffectExecutor, Execution,
};
use txinbox_core::http::{Confirm, HttpEffect, HttpEffectBuilder, Key};
use txinbox_core::{
    metrics as m, Effect, EffectOptions, EffectRunner, EffectState, Handled, HandlerError, Message,
};
use txinbox_crm_api::{CrmApi, KeyMode};

use super::{one, queue, states, Checks, Expected, Window};
use crate::lab::{lab_message, lab_processor, LabError, LabEvent};
use crate::labdb::LabStore;

/// Runs an external-call window on `store`: the queue it leaves, the outcome line and what to expect.
pub(crate) async fn run<S: LabStore>(
    store: S,
    w: Window,
    c: &mut Checks,
) -> Result<(MemoryQueue, String, Expected), LabError> {
    let key_mode = match w {
        Window::ExternalCallAnswerLost | Window::ExternalCallKeyInProgress => KeyMode::default(),
        _ => KeyMode::None,
    };
    let crm = CrmApi::builder()
        .key_mode(key_mode)
        .start()
        .await
        .map_err(|e| LabError::Usage(format!("the local CRM API could not start: {e}")))?;
    let url = crm.url();
    let destination: HttpEffectBuilder = match w {
        // Found again by key (a lookup: 404 when none), where the CRM keeps keys.
        Window::ExternalCallAnswerLost => HttpEffect::post(format!("{url}/tasks"))
            .key(Key::header("Idempotency-Key"))
            .confirm_url(format!("{url}/tasks?idempotency_key={{key}}")),
        // No idempotency: found again by the reference the payload carries (a lookup: 404 when none).
        Window::ExternalCallAnswerLostNoIdempotency => HttpEffect::post(format!("{url}/tasks"))
            .key(Key::none())
            .confirm_url(format!("{url}/tasks?external_ref={{external_ref}}")),
        // No idempotency, and a list search that answers 200 with an empty list when nothing matches. The local
        // CRM's list shows a task as soon as it is created: declared with a zero reconcile_after, instead of the
        // minute a search where no key is kept waits by default.
        Window::ExternalCallNeverReached => HttpEffect::post(format!("{url}/v1/tasks"))
            .key(Key::none())
            .confirm(
                Confirm::search(format!("{url}/v1/tasks?external_ref={{external_ref}}"))
                    .found_at("/data/0/id"),
            )
            .reconcile_after(Duration::ZERO),
        // The draft's key, a destination that holds the first call until the lab releases it, and a caller
        // that gives up after 150 ms; the list search by key does not see a task still being processed.
        _ => HttpEffect::post(format!("{url}/v1/tasks"))
            .key(Key::header("Idempotency-Key"))
            .timeout(Duration::from_millis(150))
            .confirm(Confirm::search(format!(
                "{url}/v1/tasks?idempotency_key={{key}}"
            ))),
    };
    let destination = destination
        .build()
        .map_err(|e| LabError::Usage(e.to_string()))?;
    let story = Story::default();
    let runner = EffectRunner::new(store.clone())
        .executor(
            "crm",
            Told {
                inner: destination,
                story: story.clone(),
                release_on_in_progress: (w == Window::ExternalCallKeyInProgress)
                    .then(|| crm.clone()),
            },
        )
        .options(
            EffectOptions::default()
                .idle_poll(Duration::from_millis(10))
                .backoff(Duration::from_millis(100), Duration::from_millis(400)),
        );
    let p = lab_processor(store.clone(), task_with_crm_effect::<S>);
    let q = queue(Some(5));
    q.send(lab_message(0));
    let d = one(q.receive_now(1), "delivery")?;
    let o = p.process_one(d).await;
    c.eq("the message", o.label(), "applied");
    // lab_message(0)'s follow-up, as task_with_crm_effect names it.
    let reference = "followup:oportunidade_2481:reuniao_184";

    let what = match w {
        Window::ExternalCallAnswerLost | Window::ExternalCallAnswerLostNoIdempotency => {
            // The CRM performs the call and the answer is lost on the way back.
            crm.drop_next_answers(1);
            "crm call done, answer lost"
        }
        // A gateway answers 502 and never forwards the call.
        Window::ExternalCallNeverReached => {
            crm.gateway_502_next(1);
            "gateway 502, call never forwarded"
        }
        // The CRM holds the first call (its key in progress) until the runner's second call had its 409.
        _ => {
            crm.hold_next(1);
            "the call held past the caller's timeout"
        }
    };
    let first = runner.run_pass().await;
    c.eq(
        "the first call's answer",
        states(&first).as_str(),
        "uncertain",
    );
    // Reconciled before any retry, until the effect ends (bounded: a key in progress comes back after its
    // backoff).
    let deadline = Instant::now() + Duration::from_secs(20);
    let end = loop {
        let _report = runner.run_until_idle().await;
        let (state, _) = store.effect_state().await?;
        let state = EffectState::parse(&state).unwrap_or(EffectState::Pending);
        let settled = matches!(
            state,
            EffectState::Done | EffectState::Failed | EffectState::NeedsAttention
        );
        if settled || Instant::now() >= deadline {
            break state;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    c.eq("effect state", end, EffectState::Done);
    let tasks = crm.tasks();
    c.eq("tasks at the CRM", tasks.len(), 1);
    c.eq("tasks ever created", crm.creates(), 1);
    c.eq(
        "tasks created for the follow-up",
        crm.creates_for_ref(reference),
        1,
    );
    let (_, kept) = store.effect_state().await?;
    c.eq(
        "the CRM's reference kept",
        kept,
        tasks.first().map(|t| t.id.clone()),
    );
    if w == Window::ExternalCallKeyInProgress {
        let key = tasks.first().and_then(|t| t.idempotency_key.clone());
        c.eq("the task has the effect's key", key.is_some(), true);
        c.eq(
            "tasks created under the key",
            crm.creates_for_key(key.as_deref().unwrap_or_default()),
            1,
        );
    }
    let told = story.told();
    match w {
        Window::ExternalCallNeverReached => c.eq(
            "the runner's story",
            told.as_str(),
            "call uncertain > confirm not_found > call done",
        ),
        // Held until the second call's 409: timed out, not found (held, not searchable), 409, then found.
        Window::ExternalCallKeyInProgress => c.eq(
            "the runner's story",
            told.as_str(),
            "call uncertain > confirm not_found > call in_progress > confirm done",
        ),
        _ => c.eq(
            "the runner's story",
            told.as_str(),
            "call uncertain > confirm done",
        ),
    }
    crm.shutdown().await;
    let outcome = format!("{o} > {what} > {told} (crm tasks={})", tasks.len());
    let signals = match w {
        // The lost answer: one call, then the confirmation finds it.
        Window::ExternalCallAnswerLost | Window::ExternalCallAnswerLostNoIdempotency => vec![
            (m::APPLIED, 1),
            (m::EFFECT_RECONCILIATIONS, 1),
            (m::EFFECT_EXECUTIONS, 1),
        ],
        // The 502: the confirmation finds nothing, the second call creates the task.
        Window::ExternalCallNeverReached => vec![
            (m::APPLIED, 1),
            (m::EFFECT_RECONCILIATIONS, 1),
            (m::EFFECT_EXECUTIONS, 2),
        ],
        // The held call and the one answered 409; the confirmations before and after the 409.
        _ => vec![
            (m::APPLIED, 1),
            (m::EFFECT_RECONCILIATIONS, 2),
            (m::EFFECT_EXECUTIONS, 2),
        ],
    };
    Ok((q, outcome, (1, 1, QueueState::default(), 0, signals)))
}

/// The lab's handler with an external effect: the local task, and a follow-up task to create in the CRM after
/// COMMIT, searchable there by its business reference.
fn task_with_crm_effect<S: LabStore>(
    tx: S::Tx,
    msg: Message<LabEvent>,
) -> BoxFuture<'static, Result<Handled, HandlerError>> {
    Box::pin(async move {
        let reference = format!("followup:{}:{}", msg.body.opportunity, msg.body.meeting);
        let payload = serde_json::json!({
            "opportunity": msg.body.opportunity,
            "meeting": msg.body.meeting,
            "external_ref": reference,
        });
        let effect = Effect::json("crm.create_task", "crm", &payload)?.external_ref(reference);
        Ok(S::insert_task(tx, msg).await?.effect(effect))
    })
}

/// What the runner did, in order: `call uncertain > confirm not_found > call done`.
#[derive(Clone, Default)]
struct Story(Arc<Mutex<Vec<String>>>);

impl Story {
    fn add(&self, step: String) {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(step);
    }
    fn told(&self) -> String {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .join(" > ")
    }
}

/// An executor that tells its story: each call's and confirmation's answer.
struct Told<E> {
    inner: E,
    story: Story,
    /// The key-in-progress window: once a call is answered 409 (its key in progress), the destination lets
    /// the held first call go on, and the call returns when its task exists. Done here, before the runner
    /// schedules its next confirmation, and not by the lab between passes: how many passes a loaded machine
    /// fits in the runner's backoff would otherwise decide the story.
    release_on_in_progress: Option<CrmApi>,
}

/// How long a released call may take to create its task at the local CRM API.
const RELEASED_CALL_LANDS: Duration = Duration::from_secs(10);

impl<E: EffectExecutor> EffectExecutor for Told<E> {
    fn execute<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
        Box::pin(async move {
            let r = self.inner.execute(e).await;
            if let (Execution::InProgress { .. }, Some(crm)) = (&r, &self.release_on_in_progress) {
                crm.release_held();
                let until = Instant::now() + RELEASED_CALL_LANDS;
                while crm.tasks().is_empty() && Instant::now() < until {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
            let label = match &r {
                Execution::Done { .. } => "done",
                Execution::NotSent { .. } => "not_sent",
                Execution::Rejected { .. } => "rejected",
                Execution::InProgress { .. } => "in_progress",
                _ => "uncertain",
            };
            self.story.add(format!("call {label}"));
            r
        })
    }
    fn confirm<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
        Box::pin(async move {
            let r = self.inner.confirm(e).await;
            let label = match &r {
                Confirmation::Done { .. } => "done",
                Confirmation::NotFound => "not_found",
                Confirmation::Repeat => "repeat",
                Confirmation::NotAnswered { .. } => "not_answered",
                _ => "unknown",
            };
            self.story.add(format!("confirm {label}"));
            r
        })
    }
    fn compensate<'a>(&'a self, e: &'a ClaimedEffect) -> BoxFuture<'a, Result<(), BoxError>> {
        self.inner.compensate(e)
    }
    fn reconcile_after(&self) -> Duration {
        self.inner.reconcile_after()
    }
    fn request_hash(&self, e: &ClaimedEffect) -> Option<String> {
        self.inner.request_hash(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An executor that can undo what it did, reconciles late and reports its bodies' hash.
    struct Undoes;

    impl EffectExecutor for Undoes {
        fn execute<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Execution> {
            Box::pin(async { Execution::not_sent("unused") })
        }
        fn confirm<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Confirmation> {
            Box::pin(async { Confirmation::NotFound })
        }
        fn compensate<'a>(&'a self, _: &'a ClaimedEffect) -> BoxFuture<'a, Result<(), BoxError>> {
            Box::pin(async { Ok(()) })
        }
        fn reconcile_after(&self) -> Duration {
            Duration::from_secs(7)
        }
        fn request_hash(&self, _: &ClaimedEffect) -> Option<String> {
            Some("abc".into())
        }
    }

    fn effect() -> ClaimedEffect {
        ClaimedEffect {
            id: 1,
            consumer: "lab".into(),
            message_id: "m-1".into(),
            key: "k".into(),
            name: "crm.create_task".into(),
            destination: "crm".into(),
            payload: b"{}".to_vec(),
            metadata: Default::default(),
            external_ref: "followup:o:m".into(),
            claimed_from: EffectState::Done,
            attempts: 1,
            reconciliations: 0,
            created_at: chrono::Utc::now(),
            reference: Some("task-1".into()),
            maybe_happened: false,
            sent_hash: None,
        }
    }

    /// The story-telling wrapper answers for its executor wherever it adds nothing: an operator's compensation
    /// reaches the destination's, and its reconciliation delay and body hash are the destination's.
    #[tokio::test]
    async fn the_told_executor_answers_as_its_executor() {
        let told = Told {
            inner: Undoes,
            story: Story::default(),
            release_on_in_progress: None,
        };
        let e = effect();
        assert_eq!(told.reconcile_after(), Duration::from_secs(7));
        assert_eq!(told.request_hash(&e).as_deref(), Some("abc"));
        told.compensate(&e)
            .await
            .expect("the destination's compensation, not the trait's refusal");
    }
}
