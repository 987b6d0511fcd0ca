//! Adapter options and SDK client construction.

use std::time::Duration;

use aws_sdk_sqs::config::{BehaviorVersion, SharedHttpClient};

use crate::error::SqsError;

/// SQS's ceiling on a message's visibility, counted from its receive (12 hours).
pub const MAX_VISIBILITY: Duration = Duration::from_secs(12 * 3600);
/// The shortest visibility timeout SQS accepts for a receive (its lease is renewed every third of it).
pub const MIN_VISIBILITY: Duration = Duration::from_secs(1);

/// Options of an SQS consumer. The defaults match the Terraform samples under `infra/aws-sqs-fifo`.
///
/// | option | default | note |
/// |---|---|---|
/// | [`batch_size`](Self::batch_size) | 10 | messages per `ReceiveMessage`, 1 to 10 |
/// | [`wait`](Self::wait) | 20 s | long-poll wait, 0 to 20 s |
/// | [`visibility_timeout`](Self::visibility_timeout) | 60 s | set on every receive; the lease's duration: the worker extends it by this much every third of it |
/// | [`dead_letter_queue`](Self::dead_letter_queue) | the queue's `RedrivePolicy` target | where payload collisions and permanent errors are forwarded; unset, [`SqsReceiver::connect`](crate::SqsReceiver::connect) takes the `deadLetterTargetArn` of the queue's `RedrivePolicy` |
/// | [`allow_no_dead_letter`](Self::allow_no_dead_letter) | `false` | the start-up check ([`Receiver::check`](txinbox_core::Receiver::check)) refuses a queue with no dead-letter path unless this is on |
/// | [`deduplication_id_identity`](Self::deduplication_id_identity) | `false` | whether a message without `ce-id` takes its `MessageDeduplicationId` as its identity |
///
/// What belongs to the worker is set there: concurrency in [`txinbox_core::WorkerOptions`], the longest total
/// extension in [`txinbox_core::LeaseOptions::max_total`] (SQS caps it at 12 h from the receive; the lease
/// stops there), the delay of a retry in the inbox (it reaches SQS as the visibility of
/// [`Delivery::release`](txinbox_core::Delivery::release)).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SqsOptions {
    /// Messages asked for per receive (1 to 10).
    pub batch_size: usize,
    /// Long-poll wait per receive (at most 20 s).
    pub wait: Duration,
    /// Visibility timeout set on receive and by each renewal of the lease.
    pub visibility_timeout: Duration,
    /// The dead-letter queue URL for explicit forwards (payload collisions, permanent errors, bad input).
    pub dead_letter_queue: Option<String>,
    /// Whether the FIFO `MessageDeduplicationId` is an identity for messages without CloudEvents attributes
    /// (off by default; see [`deduplication_id_identity`](Self::deduplication_id_identity)).
    pub deduplication_id_identity: bool,
    /// Whether the start-up check accepts a queue with no dead-letter path (off by default; see
    /// [`allow_no_dead_letter`](Self::allow_no_dead_letter)).
    pub allow_no_dead_letter: bool,
}

impl Default for SqsOptions {
    fn default() -> Self {
        Self {
            batch_size: 10,
            wait: Duration::from_secs(20),
            visibility_timeout: Duration::from_secs(60),
            dead_letter_queue: None,
            deduplication_id_identity: false,
            allow_no_dead_letter: false,
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
    /// Sets the visibility timeout (whole seconds, 1 s to 12 h): the lease is renewed every third of it.
    pub fn visibility_timeout(mut self, d: Duration) -> Self {
        self.visibility_timeout = d;
        self
    }
    /// Sets the dead-letter queue URL used for explicit forwards.
    pub fn dead_letter_queue(mut self, url: impl Into<String>) -> Self {
        self.dead_letter_queue = Some(url.into());
        self
    }

    /// Lets a message without CloudEvents attributes (`ce-id` + `ce-source`, or a structured CloudEvents body)
    /// take its FIFO `MessageDeduplicationId` as its identity. Off by default, because the deduplication id does
    /// not survive the dead-letter path: AWS documents that "when a message is moved from a FIFO queue to a FIFO
    /// DLQ, the original message's deduplication ID will be replaced with the original message's ID". A message
    /// applied whose deletes were lost until `maxReceiveCount` moved it to the DLQ would come back from SQS's
    /// own redrive (`StartMessageMoveTask`, which also gives it a new `MessageId`) under another identity and be
    /// applied again. What holds when you turn it on: the adapter never takes a deduplication id equal to the
    /// message's own id (a copy read from the DLQ) as an identity, and `txinbox sqs redrive` leaves such a copy
    /// in the DLQ (`identity_lost`); a message moved back by `StartMessageMoveTask` cannot be recognised, so use
    /// it only with a business key on the handler, or not at all. Off, a message without CloudEvents identity
    /// is bad input (`no_identity`) and goes to the dead-letter queue: loud, never applied twice.
    pub fn deduplication_id_identity(mut self, on: bool) -> Self {
        self.deduplication_id_identity = on;
        self
    }

    /// Accepts, at the start-up check, a queue with neither a `RedrivePolicy` nor a
    /// [`dead_letter_queue`](Self::dead_letter_queue). Off by default: on such a queue a payload collision or a
    /// permanent error has nowhere to go; it comes back once per visibility timeout, forever, logged each
    /// time. Turn it on only when that is what you want (a test queue, a consumer whose handler never fails
    /// permanently).
    pub fn allow_no_dead_letter(mut self, on: bool) -> Self {
        self.allow_no_dead_letter = on;
        self
    }

    /// The options a settings file's `[sqs]` section describes (the same file `txinbox check-infra` checks):
    /// batch size, long-poll wait, visibility timeout (renewed every third of it), the dead-letter queue URL and
    /// the identity (`identity = "deduplication-id"` turns [`deduplication_id_identity`](Self::deduplication_id_identity)
    /// on). [`validate`](Self::validate) still applies when the receiver connects.
    pub fn from_settings(s: &txinbox_core::settings::SqsSettings) -> Self {
        let mut o = Self::default()
            .batch_size(s.batch_size as usize)
            .wait(Duration::from_secs(s.wait_time_seconds))
            .visibility_timeout(Duration::from_secs(s.visibility_timeout_seconds))
            .deduplication_id_identity(matches!(
                s.identity,
                txinbox_core::settings::SqsIdentity::DeduplicationId
            ));
        if let Some(d) = &s.dead_letter_queue_url {
            o = o.dead_letter_queue(d);
        }
        o
    }

    /// Checks the options against SQS's limits. Called by [`SqsReceiver::connect`](crate::SqsReceiver::connect).
    pub fn validate(&self) -> Result<(), SqsError> {
        let bad = |detail: String| Err(SqsError::InvalidOptions { detail });
        if !(1..=10).contains(&self.batch_size) {
            return bad(format!("batch size {} is outside 1..=10", self.batch_size));
        }
        if self.wait > Duration::from_secs(20) {
            return bad(format!("long-poll wait {:?} exceeds 20 s", self.wait));
        }
        // Whole seconds on the wire: a fraction would be cut, and the lease would be renewed too late.
        if self.visibility_timeout < MIN_VISIBILITY
            || self.visibility_timeout > MAX_VISIBILITY
            || self.visibility_timeout.subsec_nanos() != 0
        {
            return bad(format!(
                "visibility timeout {:?} is not whole seconds within 1 s..=12 h",
                self.visibility_timeout
            ));
        }
        Ok(())
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
#[cfg(feature = "aws-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
pub async fn load_sdk_config() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .http_client(http_client())
        .load()
        .await
}

/// An SQS client from [`load_sdk_config`].
#[cfg(feature = "aws-config")]
#[cfg_attr(docsrs, doc(cfg(feature = "aws-config")))]
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
            (o.batch_size, o.wait, o.visibility_timeout),
            (10, Duration::from_secs(20), Duration::from_secs(60))
        );
        o.validate().unwrap();
    }

    #[test]
    fn inconsistent_options_are_refused() {
        assert!(SqsOptions::default().batch_size(11).validate().is_err());
        assert!(SqsOptions::default().batch_size(0).validate().is_err());
        for vt in [
            Duration::ZERO,
            Duration::from_millis(3500),
            Duration::from_secs(13 * 3600),
        ] {
            assert!(
                SqsOptions::default()
                    .visibility_timeout(vt)
                    .validate()
                    .is_err(),
                "{vt:?}"
            );
        }
        assert!(SqsOptions::default()
            .wait(Duration::from_secs(21))
            .validate()
            .is_err());
    }
}
