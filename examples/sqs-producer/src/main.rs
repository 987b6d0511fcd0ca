//! A small producer for the CRM follow-up agent: publishes `meeting.ended` events to an SQS FIFO queue with
//! one identity (CloudEvents `ce-id`/`ce-source`, `MessageDeduplicationId` derived from them, the opportunity
//! as `MessageGroupId`). `--create` makes the queue and its DLQ (FIFO, maxReceiveCount 5, or
//! `--max-receive-count`) first, which is handy against moto.
//!
//! ```text
//! sqs-producer --queue-name crm-events --create --opportunity oportunidade_2481 --meeting reuniao_184 [--id evt-1] [--tenant acme] [--times 2]
//! ```

use clap::Parser;
use txinbox::OutboxMessage;
use txinbox_sqs::aws_sdk_sqs::types::QueueAttributeName;
use txinbox_sqs::SqsPublisher;

#[derive(Debug, Parser)]
#[command(about = "Publish CRM meeting events to SQS FIFO with a stable identity")]
struct Args {
    /// The queue name (without `.fifo`).
    #[arg(long, default_value = "crm-events")]
    queue_name: String,
    /// Create the queue and its DLQ if missing.
    #[arg(long)]
    create: bool,
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
    /// Publish the same event this many times (inside 5 minutes SQS keeps one; later the inbox drops them).
    #[arg(long, default_value_t = 1)]
    times: u32,
    /// With --create: the redrive policy's maxReceiveCount, the receives after which SQS moves a message to
    /// the DLQ (AWS allows 1 to 1,000).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(1..=1000))]
    max_receive_count: u16,
}

async fn queue_url(
    client: &txinbox_sqs::aws_sdk_sqs::Client,
    name: &str,
    create: bool,
    max_receive_count: u16,
) -> Result<String, Box<dyn std::error::Error>> {
    if !create {
        let out = client
            .get_queue_url()
            .queue_name(format!("{name}.fifo"))
            .send()
            .await?;
        return Ok(out.queue_url().unwrap_or_default().to_owned());
    }
    let dlq = client
        .create_queue()
        .queue_name(format!("{name}-dlq.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .send()
        .await?;
    let arn = client
        .get_queue_attributes()
        .queue_url(dlq.queue_url().unwrap_or_default())
        .attribute_names(QueueAttributeName::QueueArn)
        .send()
        .await?
        .attributes()
        .and_then(|a| a.get(&QueueAttributeName::QueueArn).cloned())
        .unwrap_or_default();
    let q = client
        .create_queue()
        .queue_name(format!("{name}.fifo"))
        .attributes(QueueAttributeName::FifoQueue, "true")
        .attributes(QueueAttributeName::VisibilityTimeout, "60")
        .attributes(
            QueueAttributeName::RedrivePolicy,
            format!(r#"{{"deadLetterTargetArn":"{arn}","maxReceiveCount":"{max_receive_count}"}}"#),
        )
        .send()
        .await?;
    eprintln!(
        "queue {} (DLQ {})",
        q.queue_url().unwrap_or_default(),
        dlq.queue_url().unwrap_or_default()
    );
    Ok(q.queue_url().unwrap_or_default().to_owned())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let client = txinbox_sqs::client_from_env().await;
    let url = queue_url(
        &client,
        &args.queue_name,
        args.create,
        args.max_receive_count,
    )
    .await?;
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
    let body =
        serde_json::json!({"opportunity": args.opportunity, "meeting": args.meeting}).to_string();
    let msg = OutboxMessage {
        destination: url.clone(),
        source: "crm/meetings".into(),
        message_id: id.clone(),
        event_type: "meeting.ended".into(),
        group_id: Some(args.opportunity.clone()),
        body: body.into_bytes(),
        attributes: [
            ("ce-contractversion".to_owned(), "1".to_owned()),
            ("ce-time".to_owned(), time),
        ]
        .into_iter()
        .chain(args.tenant.clone().map(|t| ("ce-tenantid".to_owned(), t)))
        .collect(),
    };
    let publisher = SqsPublisher::new(client);
    for _ in 0..args.times.max(1) {
        let sqs_id = publisher.send(&msg).await?;
        println!("published ce-id={id} to {url} (SQS MessageId {sqs_id})");
    }
    Ok(())
}
