//! A small producer for the CRM follow-up agent: publishes `meeting.ended` events to a Service Bus queue with
//! one identity (MessageId = CloudEvents `ce-id`, plus `ce-source`, `ce-type`, `ce-specversion`). Publishing
//! the same event twice keeps the id, so Service Bus's duplicate detection drops the second copy inside its
//! window and the consumer's inbox drops it outside.
//!
//! ```text
//! servicebus-producer [--queue crm-events] [--create-on-emulator] --opportunity oportunidade_2481 --meeting reuniao_184 [--id evt-1] [--tenant acme] [--times 2]
//! ```
//!
//! Connection (never printed): `SERVICEBUS_CONNECTION_STRING`, or `SERVICEBUS_NAMESPACE` for Azure AD;
//! `SERVICEBUS_ENDPOINT` points it at the emulator. `--create-on-emulator` creates the queue and a
//! `{queue}-poison` queue through the emulator's control API with the Terraform samples' settings.

use clap::Parser;
use serde_json::json;
use txinbox::OutboxMessage;
use txinbox_servicebus::{ServiceBusConfig, ServiceBusPublisher};

#[derive(Debug, Parser)]
#[command(about = "Publish CRM meeting events to Azure Service Bus with a stable identity")]
struct Args {
    /// The queue path.
    #[arg(long, env = "CRM_SB_QUEUE", default_value = "crm-events")]
    queue: String,
    /// Create the queue and `{queue}-poison` on the emulator at SERVICEBUS_ENDPOINT first.
    #[arg(long)]
    create_on_emulator: bool,
    /// The opportunity.
    #[arg(long, default_value = "oportunidade_2481")]
    opportunity: String,
    /// The meeting.
    #[arg(long, default_value = "reuniao_184")]
    meeting: String,
    /// The event id (default: derived from opportunity and meeting, so a republish keeps it).
    #[arg(long)]
    id: Option<String>,
    /// The tenant (the CloudEvents `tenantid` extension, sent as `ce-tenantid`): a sharded worker applies the
    /// event in the shard that claims it.
    #[arg(long)]
    tenant: Option<String>,
    /// The event's time (CloudEvents `time`, sent as `ce-time`; RFC 3339; default: now). Every copy of one event
    /// carries the same: `--times` sends this one time again, as a producer re-sending an event must (the
    /// inbox's partitioned layout places the marker by it).
    #[arg(long)]
    time: Option<String>,
    /// Publish the same event this many times.
    #[arg(long, default_value_t = 1)]
    times: u32,
    /// With --create-on-emulator: the queue's LockDuration in seconds (the Terraform samples' PT1M by default).
    #[arg(long, default_value_t = 60)]
    lock_secs: u32,
    /// With --create-on-emulator: the queue's MaxDeliveryCount, the deliveries after which Service Bus moves a
    /// message to its dead-letter queue (the Terraform samples' 10 by default).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=i32::MAX as i64))]
    max_delivery_count: u32,
}

/// The Terraform samples' queue settings.
fn queue_properties(lock_secs: u32, max_delivery_count: u32) -> serde_json::Value {
    json!({
        "lockDuration": format!("PT{}S", lock_secs.clamp(1, 300)),
        "maxDeliveryCount": max_delivery_count,
        "requiresDuplicateDetection": true,
        "duplicateDetectionHistoryTimeWindow": "PT10M",
        "defaultMessageTimeToLive": "P14D",
        "deadLetteringOnMessageExpiration": true
    })
}

async fn create_on_emulator(
    queue: &str,
    lock_secs: u32,
    max_delivery_count: u32,
) -> Result<(), Box<dyn std::error::Error>> {
    let endpoint = std::env::var("SERVICEBUS_ENDPOINT")
        .map_err(|_| "--create-on-emulator needs SERVICEBUS_ENDPOINT (the emulator's URL)")?;
    let http = reqwest::Client::new();
    for (path, props) in [
        (
            queue.to_owned(),
            queue_properties(lock_secs, max_delivery_count),
        ),
        (format!("{queue}-poison"), json!({"lockDuration": "PT1M"})),
    ] {
        let r = http
            .put(format!(
                "{}/$emulator/queues/{path}",
                endpoint.trim_end_matches('/')
            ))
            .body(props.to_string())
            .send()
            .await?;
        if !r.status().is_success() {
            return Err(format!("creating {path}: HTTP {}", r.status()).into());
        }
        eprintln!("queue {path} ready on the emulator");
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    if args.create_on_emulator {
        create_on_emulator(&args.queue, args.lock_secs, args.max_delivery_count).await?;
    }
    let client = ServiceBusConfig::from_env()?.connect()?;
    let id = args
        .id
        .clone()
        .unwrap_or_else(|| format!("meeting-ended:{}:{}", args.opportunity, args.meeting));
    let time = match &args.time {
        Some(t) => chrono::DateTime::parse_from_rfc3339(t)
            .map_err(|e| format!("--time {t:?} is not RFC 3339: {e}"))?
            .to_rfc3339(),
        None => chrono::Utc::now().to_rfc3339(),
    };
    let body = json!({"opportunity": args.opportunity, "meeting": args.meeting}).to_string();
    let msg = OutboxMessage {
        destination: args.queue.clone(),
        source: "crm/meetings".into(),
        message_id: id.clone(),
        event_type: "meeting.ended".into(),
        group_id: None,
        body: body.into_bytes(),
        attributes: [
            ("ce-contractversion".to_owned(), "1".to_owned()),
            ("ce-time".to_owned(), time),
        ]
        .into_iter()
        .chain(args.tenant.clone().map(|t| ("ce-tenantid".to_owned(), t)))
        .collect(),
    };
    let publisher = ServiceBusPublisher::new(client);
    for _ in 0..args.times.max(1) {
        publisher.send(&msg).await?;
        println!("published MessageId = ce-id = {id} to {}", args.queue);
    }
    Ok(())
}
