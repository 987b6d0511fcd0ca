//! The end-to-end line through the Service Bus adapter: the emulator in this process, every data-plane request
//! delayed by the round trip, the adapter with its defaults.

use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use txinbox_lab::lab::LabError;
use txinbox_sb_emulator::{Emulator, EmulatorHandle, FaultRule, QueueProperties, RequestCounts};
use txinbox_servicebus::{
    ServiceBusClient, ServiceBusConfig, ServiceBusOptions, ServiceBusReceiver,
};

use super::{drive, Feed};
use crate::BenchArgs;

const NAMESPACE: &str = "txinbox-bench";
const KEY_NAME: &str = "RootManageSharedAccessKey";
const QUEUE: &str = "bench";

/// The emulator on a thread and a runtime of its own (the broker is another machine's work: it does not share
/// the benchmark's runtime), stopped when dropped.
struct Running {
    handle: Arc<EmulatorHandle>,
    url: String,
    key: String,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn start() -> Result<Running, LabError> {
    let key = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let (ready, started) = mpsc::channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let sas_key = key.clone();
    let thread = std::thread::Builder::new()
        .name("sb-emulator".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sb-emulator")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let started = Emulator::builder()
                    .namespace(NAMESPACE)
                    .sas_key(KEY_NAME, sas_key)
                    .queue(
                        QUEUE,
                        QueueProperties::default()
                            .lock_duration(Duration::from_secs(60))
                            .max_delivery_count(100),
                    )
                    .start("127.0.0.1:0")
                    .await;
                match started {
                    Ok(emulator) => {
                        let emulator = Arc::new(emulator);
                        let _ = ready.send(Ok(emulator.clone()));
                        let _ = stopped.await;
                        drop(emulator);
                    }
                    Err(e) => {
                        let _ = ready.send(Err(e.to_string()));
                    }
                }
            });
        })
        .map_err(|e| LabError::Usage(format!("the emulator's thread: {e}")))?;
    let handle = started
        .recv()
        .map_err(|_| LabError::Usage("the emulator's thread ended before it started".into()))?
        .map_err(|e| LabError::Usage(format!("the Service Bus emulator does not start: {e}")))?;
    Ok(Running {
        url: handle.base_url(),
        handle,
        key,
        stop: Some(stop),
        thread: Some(thread),
    })
}

/// The emulator's queue as a [`Feed`]: sends go in from this process (no request, no delay: the producer is not
/// what is measured); what waits is what was sent and not completed yet.
#[derive(Clone)]
struct ServiceBus {
    emulator: Arc<EmulatorHandle>,
    client: ServiceBusClient,
    sent: Arc<std::sync::atomic::AtomicU64>,
}

impl Feed for ServiceBus {
    type Receiver = ServiceBusReceiver;
    async fn send_all(&self, batch: Vec<(String, String)>) {
        for (id, body) in batch {
            match self.emulator.send_message(QUEUE, &id, body) {
                Ok(()) => {
                    self.sent.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // The queue exists and the message is small: a refusal is a bug of this benchmark, and the
                // run ends with fewer messages applied than sent, which it reports as an error.
                Err(e) => tracing::error!(error = %e, "the emulator refused a message"),
            }
        }
    }
    fn waiting(&self) -> u64 {
        let completed = self.emulator.request_counts().completes;
        self.sent
            .load(std::sync::atomic::Ordering::Relaxed)
            .saturating_sub(completed)
    }
    async fn receiver(&self) -> Result<Self::Receiver, LabError> {
        ServiceBusReceiver::new(&self.client, QUEUE, ServiceBusOptions::default())
            .map_err(|e| LabError::Usage(format!("the Service Bus receiver: {e}")))
    }
}

/// The Service Bus line: the shared figures, then the requests per message the emulator counted.
pub(super) async fn run(args: &BenchArgs) -> Result<(), LabError> {
    let running = start()?;
    let client = ServiceBusConfig::shared_access_key(NAMESPACE, KEY_NAME, &running.key)
        .endpoint(
            running
                .url
                .parse()
                .map_err(|e| LabError::Usage(format!("the emulator's URL: {e}")))?,
        )
        .connect()
        .map_err(|e| LabError::Usage(format!("the Service Bus client: {e}")))?;
    if args.e2e_round_trip_ms > 0 {
        running
            .handle
            .inject_fault(FaultRule::delay(args.e2e_round_trip_ms).count(u32::MAX))
            .map_err(|e| LabError::Usage(e.to_string()))?;
    }
    let feed = ServiceBus {
        emulator: running.handle.clone(),
        client,
        sent: Arc::default(),
    };
    let before = running.handle.request_counts();
    let run = drive(args, feed).await?;
    let after = running.handle.request_counts();
    println!(
        "e2e worker broker=servicebus {} {}",
        per_message(before, after, run.applied),
        run.line
    );
    Ok(())
}

/// Requests per applied message, by operation.
fn per_message(before: RequestCounts, after: RequestCounts, messages: u64) -> String {
    let m = messages.max(1) as f64;
    let per = |a: u64, b: u64| (a - b) as f64 / m;
    // The emulator's delay fault, as it really lasted: the round trip the figure was measured at.
    let delays = after.delays - before.delays;
    let round_trip = if delays == 0 {
        "0".to_owned()
    } else {
        format!(
            "{:.2}",
            (after.delay_micros - before.delay_micros) as f64 / delays as f64 / 1000.0
        )
    };
    format!(
        "broker_round_trip_ms_measured={round_trip} peek_locks_per_msg={:.2} completes_per_msg={:.2} abandons_per_msg={:.3} renewals_per_msg={:.3}",
        per(after.peek_locks, before.peek_locks),
        per(after.completes, before.completes),
        per(after.abandons, before.abandons),
        per(after.renewals, before.renewals),
    )
}
