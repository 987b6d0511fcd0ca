//! An SQS server of the benchmark's own (`--sqs-endpoint builtin`), in this process, answering at once, so that
//! the `sqs` line measures the adapter rather than an emulator (moto and LocalStack answer a few hundred
//! requests a second at most).
//!
//! It speaks the AWS JSON 1.0 protocol `aws-sdk-sqs` 1.x uses (`POST /`, `X-Amz-Target: AmazonSQS.<Action>`,
//! a JSON body; errors are HTTP 400 with `__type` and the `x-amzn-query-error` header) for the actions the
//! adapter and the benchmark send: `CreateQueue`, `GetQueueUrl`, `GetQueueAttributes`, `ListQueues`,
//! `DeleteQueue`, `PurgeQueue`, `SendMessage`, `SendMessageBatch`, `ReceiveMessage`, `DeleteMessage`,
//! `DeleteMessageBatch`, `ChangeMessageVisibility`, `ChangeMessageVisibilityBatch`.
//!
//! FIFO semantics as AWS documents them: messages in send order; a message group is blocked while any of its
//! messages is in flight; a receive walks the groups in the order of their oldest message and takes as many
//! consecutive messages of one group as it can before the next; a received message is in flight until its
//! visibility deadline (checked lazily), each receive giving it a new receipt handle and one more
//! `ApproximateReceiveCount`; a send whose deduplication id was seen in the last 5 minutes is answered as
//! successful (with the first message's id) and dropped; an empty receive with `WaitTimeSeconds` waits for a
//! send, a delete or a visibility change. A queue without `FifoQueue` is served the same way with each
//! message its own group (no ordering, no blocking).
//!
//! Not implemented: `DelaySeconds`, `maxReceiveCount` moves to a dead-letter queue (a `RedrivePolicy` is
//! stored and returned, nothing more), `MD5OfMessageAttributes`, permissions, tags, move tasks.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use serde_json::{json, Map, Value};
use tokio::sync::Notify;
use txinbox_lab::lab::LabError;

/// FIFO's deduplication interval (5 minutes), the tests' server's; the benchmark's comes from
/// `--sqs-dedup-window-secs`, 300 by default.
#[cfg(test)]
const DEDUP_WINDOW: Duration = Duration::from_secs(300);
/// How often a waiting receive looks again without being woken: visibility deadlines run out silently.
const RECHECK: Duration = Duration::from_millis(50);
/// The account id in queue URLs and ARNs.
const ACCOUNT: &str = "000000000000";

/// The running server; stops when dropped.
pub(crate) struct SqsServer {
    /// `http://127.0.0.1:PORT`, the endpoint to give the SDK.
    pub(crate) url: String,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for SqsServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SqsServer {
    /// A server on a loopback port of its own, served on the current Tokio runtime, with SQS's deduplication
    /// interval.
    #[cfg(test)]
    pub(crate) async fn start() -> Result<Self, LabError> {
        Self::start_with_dedup_window(DEDUP_WINDOW).await
    }

    /// A server on a loopback port of its own, served on the current Tokio runtime, remembering deduplication
    /// ids for `dedup_window`. The server keeps each deduplication id for the interval
    /// (about 200 bytes a message): in the benchmark's process that is memory of the broker's, which a shorter
    /// interval keeps out of the worker's RSS figures when no message is sent twice.
    pub(crate) async fn start_with_dedup_window(dedup_window: Duration) -> Result<Self, LabError> {
        let (listener, addr) = super::loopback_listener("the SQS server").await?;
        let url = format!("http://{addr}");
        let server = Arc::new(Server {
            url: url.clone(),
            queues: Mutex::default(),
            handles: AtomicU64::new(0),
            dedup_window,
        });
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let _ = stream.set_nodelay(true);
                let server = server.clone();
                tokio::spawn(async move {
                    let service = service_fn(move |req| serve(req, server.clone()));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Ok(Self { url, task })
    }
}

struct Server {
    url: String,
    queues: Mutex<HashMap<String, Arc<Queue>>>,
    /// Receipt handles given out, on every queue: each handle is unique.
    handles: AtomicU64,
    /// How long a deduplication id is remembered.
    dedup_window: Duration,
}

struct Queue {
    name: String,
    url: String,
    fifo: bool,
    created: u64,
    state: Mutex<QueueState>,
    /// Woken by sends, deletes and visibility changes: what a waiting receive waits for.
    changed: Notify,
}

/// A request's failure: HTTP 400 with this code.
struct Fault {
    /// The code of `__type` (`com.amazonaws.sqs#<code>`).
    code: &'static str,
    /// The code of `x-amzn-query-error` (what the SDK matches on for the query-compatible errors).
    query: &'static str,
    message: String,
}

impl Fault {
    fn new(code: &'static str, query: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            query,
            message: message.into(),
        }
    }
    fn no_queue(what: &str) -> Self {
        Self::new(
            "QueueDoesNotExist",
            "AWS.SimpleQueueService.NonExistentQueue",
            format!("The specified queue does not exist: {what}"),
        )
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new("InvalidParameterValue", "InvalidParameterValue", message)
    }
    fn missing(field: &str) -> Self {
        Self::new(
            "MissingParameter",
            "MissingParameter",
            format!("The request must contain the parameter {field}."),
        )
    }
    fn bad_handle(handle: &str) -> Self {
        Self::new(
            "ReceiptHandleIsInvalid",
            "ReceiptHandleIsInvalid",
            format!("The input receipt handle \"{handle}\" is not a valid receipt handle."),
        )
    }
    fn not_in_flight() -> Self {
        Self::new(
            "MessageNotInflight",
            "AWS.SimpleQueueService.MessageNotInflight",
            "The message referred to isn't in flight.",
        )
    }
}

type Answer = Result<Value, Fault>;

async fn serve(
    req: Request<Incoming>,
    server: Arc<Server>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let target = req
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => return Ok(reply(Err(Fault::invalid("unreadable body")))),
    };
    let input = if body.is_empty() {
        Value::Object(Map::new())
    } else {
        match serde_json::from_slice::<Value>(&body) {
            Ok(v @ Value::Object(_)) => v,
            _ => {
                return Ok(reply(Err(Fault::new(
                    "SerializationException",
                    "SerializationException",
                    "the body is not a JSON object",
                ))))
            }
        }
    };
    let action = target.strip_prefix("AmazonSQS.").unwrap_or("");
    let answer = match action {
        "CreateQueue" => server.create_queue(&input),
        "GetQueueUrl" => server.get_queue_url(&input),
        "GetQueueAttributes" => server.queue(&input).and_then(|q| q.get_attributes(&input)),
        "ListQueues" => Ok(server.list_queues(&input)),
        "DeleteQueue" => server.delete_queue(&input),
        "PurgeQueue" => server.queue(&input).map(|q| q.purge()),
        "SendMessage" => server.queue(&input).and_then(|q| q.send_one(&input)),
        "SendMessageBatch" => server.queue(&input).and_then(|q| q.send_batch(&input)),
        "ReceiveMessage" => match server.queue(&input) {
            Ok(q) => server.receive(q, &input).await,
            Err(e) => Err(e),
        },
        "DeleteMessage" => server.queue(&input).and_then(|q| q.delete_one(&input)),
        "DeleteMessageBatch" => server.queue(&input).and_then(|q| q.delete_batch(&input)),
        "ChangeMessageVisibility" => server
            .queue(&input)
            .and_then(|q| q.change_visibility_one(&input)),
        "ChangeMessageVisibilityBatch" => server
            .queue(&input)
            .and_then(|q| q.change_visibility_batch(&input)),
        _ => Err(Fault::new(
            "InvalidAction",
            "InvalidAction",
            format!("The action {target:?} is not valid for this endpoint."),
        )),
    };
    Ok(reply(answer))
}

fn reply(answer: Answer) -> Response<Full<Bytes>> {
    let (status, body, query) = match answer {
        Ok(v) => (StatusCode::OK, v, None),
        Err(f) => (
            StatusCode::BAD_REQUEST,
            json!({"__type": format!("com.amazonaws.sqs#{}", f.code), "message": f.message}),
            Some(f.query),
        ),
    };
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    let h = r.headers_mut();
    h.insert(
        "content-type",
        hyper::header::HeaderValue::from_static("application/x-amz-json-1.0"),
    );
    if let Some(q) = query {
        if let Ok(v) = hyper::header::HeaderValue::from_str(&format!("{q};Sender")) {
            h.insert("x-amzn-query-error", v);
        }
    }
    r
}

// ---------------------------------------------------------------------------------------------------------
// Reading the JSON input.

fn str_of<'a>(input: &'a Value, key: &str) -> Option<&'a str> {
    input.get(key).and_then(Value::as_str)
}

fn required<'a>(input: &'a Value, key: &str) -> Result<&'a str, Fault> {
    str_of(input, key).ok_or_else(|| Fault::missing(key))
}

fn int_of(input: &Value, key: &str) -> Result<Option<i64>, Fault> {
    match input.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => n
            .as_i64()
            .map(Some)
            .ok_or_else(|| Fault::invalid(format!("{key} is not an integer"))),
        Some(Value::String(s)) => s
            .parse()
            .map(Some)
            .map_err(|_| Fault::invalid(format!("{key} is not an integer"))),
        Some(_) => Err(Fault::invalid(format!("{key} is not an integer"))),
    }
}

fn names_of<'a>(input: &'a Value, key: &str) -> impl Iterator<Item = &'a str> {
    input
        .get(key)
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
}

fn entries_of(input: &Value) -> Result<&[Value], Fault> {
    let entries = input
        .get("Entries")
        .and_then(Value::as_array)
        .ok_or_else(|| Fault::missing("Entries"))?;
    if entries.is_empty() {
        return Err(Fault::new(
            "EmptyBatchRequest",
            "AWS.SimpleQueueService.EmptyBatchRequest",
            "There should be at least one entry in the request.",
        ));
    }
    if entries.len() > 10 {
        return Err(Fault::new(
            "TooManyEntriesInBatchRequest",
            "AWS.SimpleQueueService.TooManyEntriesInBatchRequest",
            "Maximum number of entries per request are 10.",
        ));
    }
    let mut ids: Vec<&str> = entries.iter().filter_map(|e| str_of(e, "Id")).collect();
    if ids.len() != entries.len() {
        return Err(Fault::missing("Entries.Id"));
    }
    ids.sort_unstable();
    if ids.windows(2).any(|w| w[0] == w[1]) {
        return Err(Fault::new(
            "BatchEntryIdsNotDistinct",
            "AWS.SimpleQueueService.BatchEntryIdsNotDistinct",
            "Two or more batch entries in the request have the same Id.",
        ));
    }
    Ok(entries)
}

fn failed_entry(id: &str, f: Fault) -> Value {
    json!({"Id": id, "Code": f.code, "Message": f.message, "SenderFault": true})
}

fn epoch_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn md5_hex(body: &str) -> String {
    use md5::{Digest, Md5};
    format!("{:x}", Md5::digest(body.as_bytes()))
}

// ---------------------------------------------------------------------------------------------------------
// Queues.

impl Server {
    fn queues(&self) -> MutexGuard<'_, HashMap<String, Arc<Queue>>> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The queue of the request's `QueueUrl` (its last path segment is the name: the URL's host may be a
    /// proxy's).
    fn queue(&self, input: &Value) -> Result<Arc<Queue>, Fault> {
        let url = required(input, "QueueUrl")?;
        let name = url.trim_end_matches('/').rsplit('/').next().unwrap_or(url);
        self.queues()
            .get(name)
            .cloned()
            .ok_or_else(|| Fault::no_queue(url))
    }

    fn create_queue(&self, input: &Value) -> Answer {
        let name = required(input, "QueueName")?;
        let valid = !name.is_empty()
            && name.len() <= 80
            && name
                .trim_end_matches(".fifo")
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
        if !valid {
            return Err(Fault::invalid(format!("invalid queue name {name:?}")));
        }
        let mut attributes: BTreeMap<String, String> = BTreeMap::new();
        if let Some(a) = input.get("Attributes").and_then(Value::as_object) {
            for (k, v) in a {
                let v = match v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                attributes.insert(k.clone(), v);
            }
        }
        let fifo = attributes.get("FifoQueue").is_some_and(|v| v == "true");
        if fifo != name.ends_with(".fifo") {
            return Err(Fault::invalid(
                "a FIFO queue's name ends with .fifo, and only a FIFO queue's",
            ));
        }
        if let Some(v) = attributes.get("VisibilityTimeout") {
            match v.parse::<u64>() {
                Ok(s) if s <= 43_200 => {}
                _ => return Err(Fault::invalid(format!("VisibilityTimeout {v:?}"))),
            }
        }
        let mut queues = self.queues();
        if let Some(q) = queues.get(name) {
            return Ok(json!({"QueueUrl": q.url}));
        }
        let url = format!("{}/{ACCOUNT}/{name}", self.url);
        let queue = Queue {
            name: name.to_owned(),
            url: url.clone(),
            fifo,
            created: epoch_ms() / 1000,
            state: Mutex::new(QueueState::with_attributes(attributes, self.dedup_window)),
            changed: Notify::new(),
        };
        queues.insert(name.to_owned(), Arc::new(queue));
        Ok(json!({ "QueueUrl": url }))
    }

    fn get_queue_url(&self, input: &Value) -> Answer {
        let name = required(input, "QueueName")?;
        self.queues()
            .get(name)
            .map(|q| json!({"QueueUrl": q.url}))
            .ok_or_else(|| Fault::no_queue(name))
    }

    fn list_queues(&self, input: &Value) -> Value {
        let prefix = str_of(input, "QueueNamePrefix").unwrap_or("");
        let mut urls: Vec<String> = self
            .queues()
            .values()
            .filter(|q| q.name.starts_with(prefix))
            .map(|q| q.url.clone())
            .collect();
        urls.sort();
        json!({ "QueueUrls": urls })
    }

    fn delete_queue(&self, input: &Value) -> Answer {
        let q = self.queue(input)?;
        self.queues().remove(&q.name);
        q.changed.notify_waiters();
        Ok(json!({}))
    }

    /// `ReceiveMessage`: what is available now, else (with `WaitTimeSeconds`) the first that becomes
    /// available within the wait.
    async fn receive(&self, queue: Arc<Queue>, input: &Value) -> Answer {
        let max = int_of(input, "MaxNumberOfMessages")?.unwrap_or(1);
        if !(1..=10).contains(&max) {
            return Err(Fault::invalid(format!(
                "MaxNumberOfMessages {max} is outside 1 to 10"
            )));
        }
        let wait = match int_of(input, "WaitTimeSeconds")? {
            Some(w) if (0..=20).contains(&w) => Some(w as u64),
            Some(w) => {
                return Err(Fault::invalid(format!(
                    "WaitTimeSeconds {w} is outside 0 to 20"
                )))
            }
            None => None,
        };
        let visibility = match int_of(input, "VisibilityTimeout")? {
            Some(v) if (0..=43_200).contains(&v) => Some(Duration::from_secs(v as u64)),
            Some(v) => return Err(Fault::invalid(format!("VisibilityTimeout {v}"))),
            None => None,
        };
        let select = Selection::of(input);
        let wait = Duration::from_secs(wait.unwrap_or_else(|| {
            queue
                .state()
                .attribute_secs("ReceiveMessageWaitTimeSeconds", 0)
        }));
        let until = Instant::now() + wait;
        loop {
            let changed = queue.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let now = Instant::now();
            let messages = queue.state().receive(
                max as usize,
                visibility,
                now,
                &self.handles,
                &select,
                queue.fifo,
            );
            if !messages.is_empty() || now >= until || !self.queues().contains_key(&queue.name) {
                return Ok(json!({ "Messages": messages }));
            }
            let _ = tokio::time::timeout((until - now).min(RECHECK), changed).await;
        }
    }
}

mod queue;
use queue::{QueueState, Selection};
#[cfg(test)]
mod tests;
