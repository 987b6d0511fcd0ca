//! Adapter options and SDK client construction.

use std::time::Duration;

use aws_config::BehaviorVersion;
use aws_sdk_sqs::config::SharedHttpClient;
use txinbox_core::{LeaseOptions, WorkerOptions};

use crate::error::SqsError;

/// SQS's ceiling on a message's visibility, counted from its receive (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);

/// Options of an SQS consumer. The defaults match the Terraform samples under `infra/aws-sqs-fifo`.
///
/// | option | default | note |
/// |---|---|---|
/// | [`batch_size`](Self::batch_size) | 10 | messages per `ReceiveMessage`, 1 to 10 |
/// | [`wait`](Self::wait) | 20 s | long-poll wait, 0 to 20 s |
/// | [`visibility_timeout`](Self::visibility_timeout) | 60 s | set on every receive; also each heartbeat's extension |
/// | [`heartbeat_interval`](Self::heartbeat_interval) | 20 s | time between `ChangeMessageVisibility` calls; below the visibility timeout |
/// | [`max_extension`](Self::max_extension) | 2 h | total time a message is kept invisible by heartbeats (SQS caps it at 12 h) |
/// | [`retry_backoff`](Self::retry_backoff) | 5 s | visibility set when a retryable failure releases a message |
/// | [`concurrency`](Self::concurrency) | 8 | messages processed at once |
/// | [`dead_letter_queue`](Self::dead_letter_queue) | none | where payload collisions and permanent errors are forwarded |
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqsOptions {
    /// Messages asked for per receive (1 to 10).
    pub batch_size: usize,
    /// Long-poll wait per receive (at most 20 s).
    pub wait: Duration,
    /// Visibility timeout set on receive and renewed by each heartbeat.
    pub visibility_timeout: Duration,
    /// Time between heartbeats (`ChangeMessageVisibility`).
    pub heartbeat_interval: Duration,
    /// Longest total time heartbeats keep one message invisible.
    pub max_extension: Duration,
    /// Visibility given to a message released after a retryable failure (the retry backoff).
    pub retry_backoff: Duration,
    /// Messages processed at once.
    pub concurrency: usize,
    /// The dead-letter queue URL for explicit forwards (payload collisions, permanent errors, bad input).
    pub dead_letter_queue: Option<String>,
}

impl Default for SqsOptions {
    fn default() -> Self {
        Self {
            batch_size: 10,
            wait: Duration::from_secs(20),
            visibility_timeout: Duration::from_secs(60),
            heartbeat_interval: Duration::from_secs(20),
            max_extension: Duration::from_secs(2 * 3600),
            retry_backoff: Duration::from_secs(5),
            concurrency: 8,
            dead_letter_queue: None,
        }
    }
}

impl SqsOptions {
    /// Sets the receive batch size (1 to 10).
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// Sets the long-poll wait (at most 20 s).
    pub fn wait(mut self, d: Duration) -> Self {
        self.wait = d;
        self
    }
    /// Sets the visibility timeout (whole seconds, 1 s to 12 h).
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d;
        self
    }
    /// Sets the heartbeat interval (must be below the visibility timeout).
    pub fn heartbeat_interval(mut self, d: Duration) -> Self {
        self.heartbeat_interval = d;
        self
    }
    /// Sets the maximum total extension (at most 12 h).
    pub fn max_extension(mut self, d: Duration) -> Self {
        self.max_extension = d;
        self
    }
    /// Sets the visibility given on release (retry backoff).
    pub fn retry_backoff(mut self, d: Duration) -> Self {
        self.retry_backoff = d;
        self
    }
    /// Sets the concurrency (at least 1).
    pub fn concurrency(mut self, n: usize) -> Self {
        self.concurrency = n;
        self
    }
    /// Sets the dead-letter queue URL used for explicit forwards.
    pub fn dead_letter_queue(mut self, url: impl Into<String>) -> Self {
        self.dead_letter_queue = Some(url.into());
        self
    }

    /// Checks the options against SQS's limits and each other.
    pub fn validate(&self) -> Result<(), SqsError> {
        let bad = |detail: String| Err(SqsError::InvalidOptions { detail });
        if !(1..=10).contains(&self.batch_size) {
            return bad(format!("batch size {} is outside 1..=10", self.batch_size));
        }
        if self.wait > Duration::from_secs(20) {
            return bad(format!("long-poll wait {:?} exceeds 20 s", self.wait));
        }
        if self.visibility_timeout < Duration::from_secs(1)
            || self.visibility_timeout > MAX_VISIBILITY
        {
            return bad(format!(
                "visibility timeout {:?} is outside 1 s..=12 h",
                self.visibility_timeout
            ));
        }
        if self.heartbeat_interval.is_zero() || self.heartbeat_interval >= self.visibility_timeout {
            return bad(format!(
                "heartbeat interval {:?} must be above zero and below the visibility timeout {:?}",
                self.heartbeat_interval, self.visibility_timeout
            ));
        }
        if self.max_extension > MAX_VISIBILITY {
            return bad(format!(
                "maximum extension {:?} exceeds SQS's 12 h",
                self.max_extension
            ));
        }
        if self.retry_backoff > MAX_VISIBILITY {
            return bad(format!(
                "retry backoff {:?} exceeds 12 h",
                self.retry_backoff
            ));
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".into());
        }
        Ok(())
    }

    /// The [`WorkerOptions`] that go with these options: concurrency, batch size and the heartbeat as the
    /// worker's lease keeper (renew every `heartbeat_interval` by `visibility_timeout`, for at most
    /// `max_extension`).
    pub fn worker_options(&self) -> WorkerOptions {
        WorkerOptions::default()
            .concurrency(self.concurrency)
            .batch_size(self.batch_size)
            .lease(
                LeaseOptions::default()
                    .interval(self.heartbeat_interval)
                    .extend_by(self.visibility_timeout)
                    .max_total(self.max_extension),
            )
    }
}

/// An HTTPS client on rustls with the *ring* provider (no OpenSSL, no aws-lc), for SDK configs built by hand.
pub fn http_client() -> SharedHttpClient {
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https()
}

/// Loads the standard AWS configuration chain (environment, shared config and credentials files, web
/// identity, ECS/EC2 metadata) with [`BehaviorVersion::latest`] and the rustls HTTP client of
/// [`http_client`]. The standard `AWS_ENDPOINT_URL_SQS` / `AWS_ENDPOINT_URL` variables point it at an
/// emulator. SSO profiles are not compiled in (use a `credential_process` or environment credentials).
pub async fn load_sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}

/// An SQS client from [`load_sdk_config`].
pub async fn client_from_env() -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::new(&load_sdk_config().await)
}

/// An SQS client from a ready `aws_sdk_sqs::Config` (for example one pointing at an emulator). The config
/// must carry an HTTP client (see [`http_client`]).
pub fn client_from_conf(conf: aws_sdk_sqs::Config) -> aws_sdk_sqs::Client {
    aws_sdk_sqs::Client::from_conf(conf)
}

/// A client for a local emulator (moto) at `endpoint`, with static dummy credentials and region `us-east-1`.
/// Never use it against AWS.
pub fn emulator_client(endpoint: &str) -> aws_sdk_sqs::Client {
    use aws_sdk_sqs::config::{Credentials, Region};
    let conf = aws_sdk_sqs::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(http_client())
        .region(Region::new("us-east-1"))
        .credentials_provider(Credentials::new(
            "testing", "testing", None, None, "emulator",
        ))
        .endpoint_url(endpoint)
        .build();
    aws_sdk_sqs::Client::from_conf(conf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_match_the_terraform_samples_and_validate() {
        let o = SqsOptions::default();
        assert_eq!(
            (
                o.batch_size,
                o.wait,
                o.visibility_timeout,
                o.heartbeat_interval
            ),
            (
                10,
                Duration::from_secs(20),
                Duration::from_secs(60),
                Duration::from_secs(20)
            )
        );
        assert_eq!(
            (o.max_extension, o.retry_backoff, o.concurrency),
            (Duration::from_secs(7200), Duration::from_secs(5), 8)
        );
        o.validate().unwrap();
        let w = o.worker_options();
        assert_eq!((w.concurrency, w.batch_size), (8, 10));
        assert_eq!(w.lease.interval, Duration::from_secs(20));
        assert_eq!(w.lease.extend_by, Duration::from_secs(60));
    }

    #[test]
    fn inconsistent_options_are_refused() {
        assert!(SqsOptions::default().batch_size(11).validate().is_err());
        assert!(SqsOptions::default().batch_size(0).validate().is_err());
        assert!(SqsOptions::default()
            .heartbeat_interval(Duration::from_secs(60))
            .validate()
            .is_err());
        assert!(SqsOptions::default()
            .max_extension(Duration::from_secs(13 * 3600))
            .validate()
            .is_err());
        assert!(SqsOptions::default()
            .wait(Duration::from_secs(21))
            .validate()
            .is_err());
    }
}
