//! The handler: the typed event, its business key, the task row (or item) written in the marker's transaction,
//! and the CRM effect recorded with it.

use txinbox::settings::HttpDestinationSettings;
use txinbox::sqlx::{self, Encode, Executor, IntoArguments, Type};
use txinbox::store::Backend;
use txinbox::{Effect, Handled, HandlerError, Message, Store, Tx};

pub(crate) const TASKS_PG: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TIMESTAMPTZ NOT NULL DEFAULT now())";
pub(crate) const TASKS_SQLITE: &str = "CREATE TABLE IF NOT EXISTS crm_followup_tasks (task_id TEXT PRIMARY KEY, opportunity TEXT NOT NULL, meeting TEXT NOT NULL, message_id TEXT NOT NULL, created_at TEXT NOT NULL DEFAULT CURRENT_TIMESTAMP)";

/// Creates the agent's task table on PostgreSQL (idempotent).
pub async fn create_tables_pg(store: &Store<sqlx::Postgres>) -> Result<(), sqlx::Error> {
    sqlx::query(TASKS_PG)
        .execute(store.pool())
        .await
        .map(|_| ())
}

/// The event: a meeting of an opportunity ended.
#[derive(Clone, Debug, serde::Deserialize)]
pub struct MeetingEnded {
    /// The CRM opportunity.
    pub opportunity: String,
    /// The meeting.
    pub meeting: String,
}

/// The agent's business key: one follow-up per opportunity and meeting.
pub fn business_key(e: &MeetingEnded) -> Option<String> {
    Some(format!(
        "criar_tarefa_followup:{}:{}",
        e.opportunity, e.meeting
    ))
}

/// The agent's handler: the local record of the follow-up task in the inbox's transaction and, when an
/// external CRM is configured, the task to create there after COMMIT (an effect with its idempotency key,
/// searchable at the CRM by the follow-up's reference). Generic over the backend, so the bounds say what its
/// statements need (a handler for one backend needs none).
pub async fn create_task<DB>(
    tx: Tx<DB>,
    msg: Message<MeetingEnded>,
    with_crm: bool,
) -> Result<Handled, HandlerError>
where
    DB: Backend,
    for<'c> &'c Tx<DB>: Executor<'c, Database = DB>,
    for<'q> <DB as sqlx::Database>::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> String: Encode<'q, DB> + Type<DB>,
{
    let MeetingEnded {
        opportunity,
        meeting,
    } = msg.body;
    let task_id = format!("followup-{opportunity}-{meeting}");
    let crm_task = crm_effect(&opportunity, &meeting, &task_id)?;
    // `$n` placeholders work on both backends.
    sqlx::query("INSERT INTO crm_followup_tasks (task_id, opportunity, meeting, message_id) VALUES ($1, $2, $3, $4)")
        .bind(task_id.clone())
        .bind(opportunity)
        .bind(meeting)
        .bind(msg.identity.message_id)
        .execute(&tx)
        .await?;
    let done = Handled::reference(task_id);
    Ok(if with_crm {
        done.effect(crm_task)
    } else {
        done
    })
}

/// The agent's handler on DynamoDB: the follow-up task is an item of the inbox's own table (single-table
/// design: `pk = followup#<task>`), written in the same `TransactWriteItems` as the marker. It counts the
/// applications that reached it (`applied`), so a doubled application would show as 2.
pub async fn create_task_dynamodb(
    tx: txinbox::dynamodb::DynamoTx,
    msg: Message<MeetingEnded>,
    table: String,
    with_crm: bool,
) -> Result<Handled, HandlerError> {
    use txinbox::dynamodb::aws_sdk_dynamodb::types::{AttributeValue as V, Update};
    let MeetingEnded {
        opportunity,
        meeting,
    } = msg.body;
    let task_id = format!("followup-{opportunity}-{meeting}");
    let crm_task = crm_effect(&opportunity, &meeting, &task_id)?;
    tx.update(
        Update::builder()
            .table_name(table)
            .key("pk", V::S(format!("followup#{task_id}")))
            .update_expression(
                "SET opportunity = :o, meeting = :m, message_id = :id ADD applied :one",
            )
            .expression_attribute_values(":o", V::S(opportunity))
            .expression_attribute_values(":m", V::S(meeting))
            .expression_attribute_values(":id", V::S(msg.identity.message_id))
            .expression_attribute_values(":one", V::N("1".into()))
            .build()
            .map_err(HandlerError::permanent)?,
    )?;
    let done = Handled::reference(task_id);
    Ok(if with_crm {
        done.effect(crm_task)
    } else {
        done
    })
}

/// The task to create at the external CRM, with the follow-up's reference.
fn crm_effect(opportunity: &str, meeting: &str, task_id: &str) -> Result<Effect, HandlerError> {
    Ok(Effect::json(
        "crm.create_task",
        CRM,
        &serde_json::json!({
            "title": format!("Follow up meeting {meeting} of opportunity {opportunity}"),
            "opportunity": opportunity,
            "meeting": meeting,
            "external_ref": task_id,
        }),
    )?
    .external_ref(task_id.to_owned()))
}

/// The destination name of the external CRM.
pub const CRM: &str = "crm";

/// The external CRM at `url` (`txinbox-crm-api`) as a destination, what `--crm-url` stands for: tasks POSTed
/// to `{url}/tasks` with their `Idempotency-Key`, which it honours, found again by key
/// (`{url}/tasks?idempotency_key=...`, 404 when none) when an answer was lost. The same as the settings file's
///
/// ```toml
/// [effects.destinations.crm]
/// url = "http://127.0.0.1:8088/tasks"
/// key = "header:Idempotency-Key"
/// timeout_seconds = 5
/// confirm = { url = "http://127.0.0.1:8088/tasks?idempotency_key={key}", rule = "lookup" }
/// ```
pub fn crm_destination(url: &str) -> HttpDestinationSettings {
    let url = url.trim_end_matches('/');
    let mut confirm = txinbox::settings::ConfirmSettings::default();
    confirm.url = format!("{url}/tasks?idempotency_key={{key}}");
    confirm.rule = Some("lookup".into());
    let mut d = HttpDestinationSettings::default();
    d.url = format!("{url}/tasks");
    d.key = Some("header:Idempotency-Key".into());
    d.timeout_seconds = Some(5);
    d.confirm = Some(confirm);
    d
}
