//! What the chaos tests share: a seeded random source, and the dead-letter queues of both brokers.

use std::time::Duration;

use super::*;

/// splitmix64: random moments, replayable from a printed seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A duration in `[lo, hi)` milliseconds.
    pub fn millis(&mut self, lo: u64, hi: u64) -> Duration {
        Duration::from_millis(lo + self.next() % (hi - lo))
    }
}

/// The seed of a chaos run: `TXINBOX_CHAOS_SEED` replays one, else the clock. Printed.
pub fn chaos_seed() -> u64 {
    let seed = std::env::var("TXINBOX_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(7, |d| d.as_nanos() as u64)
        });
    println!("TXINBOX_CHAOS_SEED={seed}");
    seed
}

/// What the test asks of a broker: messages it dead-lettered so far.
pub trait DeadLetters {
    async fn count(&self) -> u64;
}

pub struct SqsDlq {
    pub client: txinbox_sqs::aws_sdk_sqs::Client,
    pub url: String,
}

impl DeadLetters for SqsDlq {
    async fn count(&self) -> u64 {
        sqs_messages(&self.client, &self.url).await
    }
}

pub struct ServiceBusDlq<'a> {
    pub emulator: &'a txinbox_sb_emulator::EmulatorHandle,
    pub queue: String,
}

impl DeadLetters for ServiceBusDlq<'_> {
    async fn count(&self) -> u64 {
        let dead = self
            .emulator
            .queue_state(&self.queue)
            .map_or(0, |s| s.dead_letter_message_count);
        let poison = self
            .emulator
            .queue_state(&format!("{}-poison", self.queue))
            .map_or(0, |s| s.active_message_count + s.dead_letter_message_count);
        (dead + poison) as u64
    }
}

/// An emulator in this process, with a SAS rule, and the environment the examples read to reach it.
pub async fn service_bus(
    namespace: &str,
) -> (
    txinbox_sb_emulator::EmulatorHandle,
    Vec<(&'static str, String)>,
) {
    let key = random_key();
    let emulator = txinbox_sb_emulator::Emulator::builder()
        .namespace(namespace)
        .sas_key("RootManageSharedAccessKey", &key)
        .start("127.0.0.1:0")
        .await
        .expect("the Service Bus emulator starts");
    let env = vec![
        (
            "SERVICEBUS_CONNECTION_STRING",
            format!(
                "Endpoint=sb://{namespace}.servicebus.windows.net/;SharedAccessKeyName=RootManageSharedAccessKey;SharedAccessKey={key}"
            ),
        ),
        ("SERVICEBUS_ENDPOINT", emulator.base_url()),
    ];
    (emulator, env)
}

/// Starts `worker` with `args` and `--health-addr`, and waits (at most 60 s) until its `/readyz` answers 200:
/// started (its SIGTERM handler installed, so a SIGTERM is a graceful stop), a receive succeeded.
pub async fn ready_worker(
    dir: &std::path::Path,
    name: &str,
    worker: &str,
    args: &[&str],
    env: &[(&str, String)],
    client: &reqwest::Client,
) -> Proc {
    let health = free_addr().to_string();
    let mut args = args.to_vec();
    args.extend(["--health-addr", &health]);
    let mut w = Proc::spawn(dir, name, worker, &args, env);
    let ready = format!("http://{health}/readyz");
    let deadline = Deadline::after(Duration::from_secs(60));
    while !matches!(get(client, &ready).await, Some((200, _))) {
        w.assert_running();
        assert!(
            !deadline.passed(),
            "{name}: not ready after 60 s:\n{}",
            w.tail()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    w
}
