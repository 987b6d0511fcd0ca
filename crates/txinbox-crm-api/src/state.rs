//! The in-memory CRM: tasks, the idempotency-key table, counters and armed faults.
//!
//! Everything here is synchronous and runs under one mutex, so two requests with the same key are
//! serialized: the second one sees the first one's record.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A task created by `POST /tasks`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct Task {
    /// `task-<n>`, `n` counting from 1 in creation order.
    pub id: String,
    /// The `Idempotency-Key` the task was created under; always `None` without idempotency
    /// support (the header is ignored there).
    pub idempotency_key: Option<String>,
    /// The request body's `external_ref` string, the searchable reference.
    pub external_ref: Option<String>,
    /// The request body, as received.
    pub body: Value,
}

/// The faults still armed, as `GET /_faults` and `POST /_faults` answer them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Faults {
    /// The next `drop_answer` `POST /tasks` are performed, then answered by closing the
    /// connection.
    pub drop_answer: u64,
    /// The next `fail_before` `POST /tasks` answer 503 without performing anything.
    pub fail_before: u64,
}

/// The fault that applies to one `POST /tasks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    None,
    FailBefore,
    DropAnswer,
}

/// What a well-formed `POST /tasks` did.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PostOutcome {
    /// A task was created; the response body (also stored under the key, if any).
    Created(Vec<u8>),
    /// The key was seen before with the same body: the first response body, byte for byte.
    Replayed(Vec<u8>),
    /// The key was seen before with another body; nothing created.
    KeyReused,
}

/// What is remembered about an idempotency key.
#[derive(Debug)]
struct KeyRecord {
    /// The first request's body, compared as JSON (not as bytes) with later ones.
    request: Value,
    /// The first response body.
    response: Vec<u8>,
    /// Index into `State::tasks`.
    task: usize,
}

/// The whole CRM.
#[derive(Debug)]
pub(crate) struct State {
    idempotency: bool,
    tasks: Vec<Task>,
    keys: HashMap<String, KeyRecord>,
    calls: u64,
    faults: Faults,
    /// Ids of tasks deleted (`DELETE /tasks/{id}`): gone from every listing and search; their keys stay
    /// recorded, so a replay of a key answers as before (the key was used).
    deleted: std::collections::HashSet<String>,
}

impl State {
    pub(crate) fn new(idempotency: bool) -> Self {
        Self {
            idempotency,
            tasks: Vec::new(),
            keys: HashMap::new(),
            calls: 0,
            faults: Faults::default(),
            deleted: Default::default(),
        }
    }

    pub(crate) fn idempotency(&self) -> bool {
        self.idempotency
    }

    /// Counts one `POST /tasks` and consumes the fault that applies to it, if any.
    /// `fail_before` goes first: a request it refuses is not performed, so cannot lose an answer.
    pub(crate) fn begin_post(&mut self) -> Fault {
        self.calls = self.calls.saturating_add(1);
        if self.faults.fail_before > 0 {
            self.faults.fail_before -= 1;
            Fault::FailBefore
        } else if self.faults.drop_answer > 0 {
            self.faults.drop_answer -= 1;
            Fault::DropAnswer
        } else {
            Fault::None
        }
    }

    /// Performs a well-formed `POST /tasks`. `key` is ignored without idempotency support.
    pub(crate) fn post(
        &mut self,
        key: Option<String>,
        body: Value,
        external_ref: Option<String>,
    ) -> PostOutcome {
        let key = if self.idempotency { key } else { None };
        if let Some(key) = &key {
            if let Some(record) = self.keys.get(key) {
                return if record.request == body {
                    PostOutcome::Replayed(record.response.clone())
                } else {
                    PostOutcome::KeyReused
                };
            }
        }
        let task = Task {
            id: format!("task-{}", self.tasks.len() + 1),
            idempotency_key: key.clone(),
            external_ref,
            body,
        };
        let response = task_json(&task);
        if let Some(key) = key {
            self.keys.insert(
                key,
                KeyRecord {
                    request: task.body.clone(),
                    response: response.clone(),
                    task: self.tasks.len(),
                },
            );
        }
        self.tasks.push(task);
        PostOutcome::Created(response)
    }

    /// The task created under `key` (never found without idempotency support).
    pub(crate) fn task_with_key(&self, key: &str) -> Option<&Task> {
        self.keys
            .get(key)
            .and_then(|r| self.tasks.get(r.task))
            .filter(|t| !self.deleted.contains(&t.id))
    }

    /// Deletes task `id`; `false` when there is no such task (or it is already deleted).
    pub(crate) fn delete(&mut self, id: &str) -> bool {
        self.tasks.iter().any(|t| t.id == id) && self.deleted.insert(id.to_owned())
    }

    /// The first task whose body had `"external_ref": reference`.
    pub(crate) fn task_with_external_ref(&self, reference: &str) -> Option<&Task> {
        self.live()
            .find(|t| t.external_ref.as_deref() == Some(reference))
    }

    /// The tasks not deleted, in creation order.
    pub(crate) fn tasks(&self) -> Vec<Task> {
        self.live().cloned().collect()
    }

    fn live(&self) -> impl Iterator<Item = &Task> {
        self.tasks.iter().filter(|t| !self.deleted.contains(&t.id))
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

    pub(crate) fn calls(&self) -> u64 {
        self.calls
    }

    pub(crate) fn faults(&self) -> Faults {
        self.faults
    }

    pub(crate) fn set_drop_answer(&mut self, n: u64) {
        self.faults.drop_answer = n;
    }

    pub(crate) fn set_fail_before(&mut self, n: u64) {
        self.faults.fail_before = n;
    }
}

/// A task's JSON, as `201` and the searches answer it.
pub(crate) fn task_json(task: &Task) -> Vec<u8> {
    // Serializing a struct of strings and a `Value` cannot fail.
    serde_json::to_vec(task).unwrap_or_else(|_| b"{}".to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_key_is_replayed_byte_for_byte_and_refused_with_another_body() {
        let mut state = State::new(true);
        let body = json!({"external_ref": "r1", "title": "call back"});
        let PostOutcome::Created(first) =
            state.post(Some("k".into()), body.clone(), Some("r1".into()))
        else {
            panic!("expected a creation");
        };
        assert_eq!(
            state.post(Some("k".into()), body, Some("r1".into())),
            PostOutcome::Replayed(first.clone())
        );
        assert_eq!(
            state.post(Some("k".into()), json!({"other": 1}), None),
            PostOutcome::KeyReused
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
        let mut state = State::new(false);
        for _ in 0..2 {
            assert!(matches!(
                state.post(
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
        assert_eq!(
            state.task_with_external_ref("r").map(|t| t.id.as_str()),
            Some("task-1")
        );
    }

    #[test]
    fn fail_before_is_consumed_before_drop_answer() {
        let mut state = State::new(true);
        state.set_drop_answer(1);
        state.set_fail_before(1);
        assert_eq!(state.begin_post(), Fault::FailBefore);
        assert_eq!(state.begin_post(), Fault::DropAnswer);
        assert_eq!(state.begin_post(), Fault::None);
        assert_eq!(state.calls(), 3);
        assert_eq!(state.faults(), Faults::default());
    }
}
