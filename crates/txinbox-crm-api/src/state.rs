//! The in-memory CRM: tasks, the idempotency-key table, counters and armed faults.
//!
//! Everything here is synchronous and runs under one mutex, so two requests with the same key are
//! serialized: the second one sees the first one's record (a finished one, or an "in progress"
//! reservation while a create is processing).

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use crate::faults::{Fault, Faults};
use crate::KeyMode;

/// A task, created by `POST /tasks`, `POST /v1/tasks` or `PUT /v1/tasks/by_ref/{external_ref}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Task {
    /// `task-<n>`, `n` counting from 1 in creation order.
    pub id: String,
    /// The idempotency key the task was created under; always `None` without idempotency
    /// support (the key is ignored there) and for tasks created by the upsert.
    pub idempotency_key: Option<String>,
    /// The request body's `external_ref` string (the path's for the upsert), the searchable
    /// reference.
    pub external_ref: Option<String>,
    /// The request body, as received (the last one for a task replaced by the upsert).
    pub body: Value,
}

/// The family of routes a create came through: each answers with its own task shape, and an
/// idempotency key belongs to the family it was first used on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Route {
    /// `POST /tasks`.
    Legacy,
    /// `POST /v1/tasks`.
    V1,
}

/// What a well-formed create did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PostOutcome {
    /// A task was created; the response body (also stored under the key, if any).
    Created(Vec<u8>),
    /// The key was seen before with the same body: the first response body, byte for byte.
    Replayed(Vec<u8>),
    /// The key was seen before with another body; nothing created.
    KeyReused,
    /// The key was first used on the other family of routes; nothing created.
    KeyUsedElsewhere,
    /// A request with this key is still being processed; nothing created.
    InProgress,
}

/// Where a key's first request is.
#[derive(Debug)]
enum Phase {
    /// Being processed: no task yet.
    InProgress,
    /// Done: the first response body and the index into `State::tasks`.
    Done { response: Vec<u8>, task: usize },
}

/// What is remembered about an idempotency key.
#[derive(Debug)]
struct KeyRecord {
    route: Route,
    /// The first request's body, compared as JSON (not as bytes) with later ones.
    request: Value,
    phase: Phase,
}

/// A task and when the searches start seeing it.
#[derive(Debug)]
struct Stored {
    task: Task,
    searchable_at: Instant,
}

/// The whole CRM.
#[derive(Debug)]
pub(crate) struct State {
    key_mode: KeyMode,
    search_lag: Duration,
    /// Every task ever created, deleted ones included (`creates()` counts them).
    tasks: Vec<Stored>,
    keys: HashMap<String, KeyRecord>,
    calls: u64,
    pub(crate) faults: Faults,
    /// Ids of tasks deleted (`DELETE /tasks/{id}`): gone from every listing and search; their keys stay
    /// recorded, so a replay of a key answers as before (the key was used).
    deleted: HashSet<String>,
}

impl State {
    pub(crate) fn new(key_mode: KeyMode, search_lag: Duration) -> Self {
        Self {
            key_mode,
            search_lag,
            tasks: Vec::new(),
            keys: HashMap::new(),
            calls: 0,
            faults: Faults::default(),
            deleted: HashSet::new(),
        }
    }

    pub(crate) fn key_mode(&self) -> &KeyMode {
        &self.key_mode
    }

    /// Counts one create request and consumes the fault that applies to it, if any.
    pub(crate) fn begin_post(&mut self) -> Fault {
        self.calls = self.calls.saturating_add(1);
        self.faults.next()
    }

    /// What a known key answers, `None` for an unknown key.
    fn known_key(&self, route: Route, key: &str, body: &Value) -> Option<PostOutcome> {
        let record = self.keys.get(key)?;
        Some(if record.route != route {
            PostOutcome::KeyUsedElsewhere
        } else if record.request != *body {
            PostOutcome::KeyReused
        } else {
            match &record.phase {
                Phase::InProgress => PostOutcome::InProgress,
                Phase::Done { response, .. } => PostOutcome::Replayed(response.clone()),
            }
        })
    }

    /// Without idempotency support keys are ignored.
    fn effective_key(&self, key: Option<String>) -> Option<String> {
        key.filter(|_| self.key_mode != KeyMode::None)
    }

    /// Performs a well-formed create at once (no processing time).
    pub(crate) fn post(
        &mut self,
        route: Route,
        key: Option<String>,
        body: Value,
        external_ref: Option<String>,
    ) -> PostOutcome {
        let key = self.effective_key(key);
        if let Some(outcome) = key.as_deref().and_then(|k| self.known_key(route, k, &body)) {
            return outcome;
        }
        self.create(route, key, body, external_ref)
    }

    /// First half of a create that takes processing time: answers a known key, or records an
    /// unknown one as in progress and returns `None` (the caller then calls [`State::create`]).
    pub(crate) fn reserve(
        &mut self,
        route: Route,
        key: Option<&str>,
        body: &Value,
    ) -> Option<PostOutcome> {
        let key = self.effective_key(key.map(str::to_owned))?;
        if let Some(outcome) = self.known_key(route, &key, body) {
            return Some(outcome);
        }
        let request = body.clone();
        let phase = Phase::InProgress;
        self.keys.insert(
            key,
            KeyRecord {
                route,
                request,
                phase,
            },
        );
        None
    }

    /// Creates a task (its key unknown or reserved by [`State::reserve`]).
    pub(crate) fn create(
        &mut self,
        route: Route,
        key: Option<String>,
        body: Value,
        external_ref: Option<String>,
    ) -> PostOutcome {
        let key = self.effective_key(key);
        let task = Task {
            id: format!("task-{}", self.tasks.len() + 1),
            idempotency_key: key.clone(),
            external_ref,
            body,
        };
        let response = match route {
            Route::Legacy => task_json(&task),
            Route::V1 => to_bytes(&v1_task(&task)),
        };
        if let Some(key) = key {
            self.keys.insert(
                key,
                KeyRecord {
                    route,
                    request: task.body.clone(),
                    phase: Phase::Done {
                        response: response.clone(),
                        task: self.tasks.len(),
                    },
                },
            );
        }
        self.push(task);
        PostOutcome::Created(response)
    }

    fn push(&mut self, task: Task) {
        let searchable_at = Instant::now() + self.search_lag;
        self.tasks.push(Stored {
            task,
            searchable_at,
        });
    }

    /// `PUT /v1/tasks/by_ref/{external_ref}`: replaces the body of the oldest live task with that
    /// reference, or creates one. The task id and whether it was created.
    pub(crate) fn upsert(&mut self, external_ref: &str, body: Value) -> (String, bool) {
        let deleted = &self.deleted;
        let existing = self.tasks.iter_mut().find(|s| {
            s.task.external_ref.as_deref() == Some(external_ref) && !deleted.contains(&s.task.id)
        });
        if let Some(stored) = existing {
            stored.task.body = body;
            return (stored.task.id.clone(), false);
        }
        let id = format!("task-{}", self.tasks.len() + 1);
        self.push(Task {
            id: id.clone(),
            idempotency_key: None,
            external_ref: Some(external_ref.to_owned()),
            body,
        });
        (id, true)
    }

    /// The live task created under `key` (never found without idempotency support, nor while
    /// its create is processing).
    pub(crate) fn task_with_key(&self, key: &str) -> Option<&Task> {
        match self.keys.get(key)?.phase {
            Phase::Done { task, .. } => self.tasks.get(task).map(|s| &s.task),
            Phase::InProgress => None,
        }
        .filter(|t| !self.deleted.contains(&t.id))
    }

    /// The live task `id`.
    pub(crate) fn task(&self, id: &str) -> Option<&Task> {
        self.live().find(|t| t.id == id)
    }

    /// Deletes task `id`; `false` when there is no such task (or it is already deleted).
    pub(crate) fn delete(&mut self, id: &str) -> bool {
        self.tasks.iter().any(|s| s.task.id == id) && self.deleted.insert(id.to_owned())
    }

    /// The first live task whose body had `"external_ref": reference`.
    pub(crate) fn task_with_external_ref(&self, reference: &str) -> Option<&Task> {
        self.live()
            .find(|t| t.external_ref.as_deref() == Some(reference))
    }

    /// The tasks not deleted, in creation order.
    pub(crate) fn tasks(&self) -> Vec<Task> {
        self.live().cloned().collect()
    }

    fn live(&self) -> impl Iterator<Item = &Task> {
        self.tasks
            .iter()
            .map(|s| &s.task)
            .filter(|t| !self.deleted.contains(&t.id))
    }

    /// The live tasks the searches see at `now` (created at least `search_lag` ago), in creation
    /// order.
    pub(crate) fn searchable(&self, now: Instant) -> impl Iterator<Item = &Task> {
        self.tasks
            .iter()
            .filter(move |s| s.searchable_at <= now)
            .map(|s| &s.task)
            .filter(|t| !self.deleted.contains(&t.id))
    }

    pub(crate) fn count_with_key(&self, key: &str) -> usize {
        self.live()
            .filter(|t| t.idempotency_key.as_deref() == Some(key))
            .count()
    }

    pub(crate) fn count_with_external_ref(&self, reference: &str) -> usize {
        self.live()
            .filter(|t| t.external_ref.as_deref() == Some(reference))
            .count()
    }

    /// Tasks ever created, deleted ones included.
    pub(crate) fn creates(&self) -> usize {
        self.tasks.len()
    }

    /// Tasks ever created with `"external_ref": reference`, deleted ones included.
    pub(crate) fn creates_for_ref(&self, reference: &str) -> usize {
        self.tasks
            .iter()
            .filter(|s| s.task.external_ref.as_deref() == Some(reference))
            .count()
    }

    /// Tasks ever created under `key`, deleted ones included.
    pub(crate) fn creates_for_key(&self, key: &str) -> usize {
        self.tasks
            .iter()
            .filter(|s| s.task.idempotency_key.as_deref() == Some(key))
            .count()
    }

    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }
}

fn to_bytes(value: &impl Serialize) -> Vec<u8> {
    // Serializing strings and `Value`s cannot fail.
    serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec())
}

/// A task's JSON in the legacy shape, as `POST /tasks` and `GET /tasks` answer it.
pub(crate) fn task_json(task: &Task) -> Vec<u8> {
    to_bytes(task)
}

/// A task's JSON in the `/v1` shape (Stripe-like: an `object` tag).
pub(crate) fn v1_task(task: &Task) -> Value {
    json!({
        "id": task.id,
        "object": "task",
        "external_ref": task.external_ref,
        "idempotency_key": task.idempotency_key,
        "body": task.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(idempotency: bool) -> State {
        let mode = if idempotency {
            KeyMode::default()
        } else {
            KeyMode::None
        };
        State::new(mode, Duration::ZERO)
    }

    #[test]
    fn a_key_is_replayed_byte_for_byte_and_refused_with_another_body() {
        let mut state = state(true);
        let body = json!({"external_ref": "r1", "title": "call back"});
        let legacy = Route::Legacy;
        let PostOutcome::Created(first) =
            state.post(legacy, Some("k".into()), body.clone(), Some("r1".into()))
        else {
            panic!("expected a creation");
        };
        assert_eq!(
            state.post(legacy, Some("k".into()), body.clone(), Some("r1".into())),
            PostOutcome::Replayed(first.clone())
        );
        assert_eq!(
            state.post(legacy, Some("k".into()), json!({"other": 1}), None),
            PostOutcome::KeyReused
        );
        assert_eq!(
            state.post(Route::V1, Some("k".into()), body, Some("r1".into())),
            PostOutcome::KeyUsedElsewhere
        );
        assert_eq!(state.tasks().len(), 1);
        assert_eq!(state.count_with_key("k"), 1);
        assert_eq!(
            state.task_with_key("k").map(|t| t.id.as_str()),
            Some("task-1")
        );
        let parsed: Task = serde_json::from_slice(&first).unwrap();
        assert_eq!(parsed, state.tasks()[0]);
    }

    #[test]
    fn without_idempotency_every_post_creates_and_keys_are_not_stored() {
        let mut state = state(false);
        for _ in 0..2 {
            assert!(matches!(
                state.post(
                    Route::Legacy,
                    Some("k".into()),
                    json!({"external_ref": "r"}),
                    Some("r".into())
                ),
                PostOutcome::Created(_)
            ));
        }
        assert_eq!(state.tasks().len(), 2);
        assert_eq!(state.count_with_key("k"), 0);
        assert!(state.task_with_key("k").is_none());
        assert_eq!(state.count_with_external_ref("r"), 2);
        assert_eq!(state.creates_for_ref("r"), 2);
        assert_eq!(
            state.task_with_external_ref("r").map(|t| t.id.as_str()),
            Some("task-1")
        );
    }

    #[test]
    fn a_reserved_key_is_in_progress_until_created() {
        let mut state = state(true);
        let body = json!({"n": 1});
        assert_eq!(state.reserve(Route::V1, Some("k"), &body), None);
        assert_eq!(
            state.reserve(Route::V1, Some("k"), &body),
            Some(PostOutcome::InProgress)
        );
        assert_eq!(
            state.reserve(Route::V1, Some("k"), &json!({"n": 2})),
            Some(PostOutcome::KeyReused)
        );
        assert!(state.task_with_key("k").is_none());
        let created = state.create(Route::V1, Some("k".into()), body.clone(), None);
        let PostOutcome::Created(first) = created else {
            panic!("expected a creation, got {created:?}");
        };
        assert_eq!(
            state.reserve(Route::V1, Some("k"), &body),
            Some(PostOutcome::Replayed(first))
        );
        assert_eq!(state.creates_for_key("k"), 1);
    }

    #[test]
    fn the_upsert_never_makes_two_tasks_for_one_reference() {
        let mut state = state(true);
        assert_eq!(
            state.upsert("r", json!({"v": 1})),
            ("task-1".to_string(), true)
        );
        assert_eq!(
            state.upsert("r", json!({"v": 2})),
            ("task-1".to_string(), false)
        );
        assert_eq!(state.tasks()[0].body, json!({"v": 2}));
        assert!(state.delete("task-1"));
        assert_eq!(
            state.upsert("r", json!({"v": 3})),
            ("task-2".to_string(), true)
        );
        assert_eq!((state.creates(), state.creates_for_ref("r")), (2, 2));
        assert_eq!(state.count_with_external_ref("r"), 1);
    }

    #[test]
    fn searches_see_a_task_after_the_lag() {
        let mut state = State::new(KeyMode::default(), Duration::from_secs(60));
        state.post(Route::V1, None, json!({}), Some("r".into()));
        let now = Instant::now();
        assert_eq!(state.searchable(now).count(), 0);
        assert!(state.task("task-1").is_some());
        assert_eq!(state.searchable(now + Duration::from_secs(61)).count(), 1);
    }
}
