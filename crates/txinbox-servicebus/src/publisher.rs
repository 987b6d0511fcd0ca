//! Publishing with one identity: the MessageId (which Service Bus's duplicate detection keys on) and the
//! CloudEvents properties (`ce-id`, `ce-source`, `ce-type`, `ce-specversion`) come from the same
//! [`OutboxMessage`].

use std::collections::HashMap;

use azure_messaging_servicebus::service_bus::{SendMessageOptions, SettableBrokerProperties};
use txinbox_core::{BrokerError, BrokerErrorKind, OutboxMessage, Publisher};

use crate::config::ServiceBusClient;
use crate::error::send_error;
use crate::wire::quote_property;

/// Longest custom property value written (the service allows 32 KiB per property, 64 KiB in all).
const MAX_PROPERTY: usize = 4096;

/// The send options for `msg`: `MessageId` = `msg.message_id`, `SessionId` = `msg.group_id`, the CloudEvents
/// binary-mode properties and `msg.attributes` as quoted string properties, and `content_type`.
pub fn send_options(msg: &OutboxMessage, content_type: Option<&str>) -> SendMessageOptions {
    let custom: HashMap<String, String> = msg
        .wire_attributes()
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), quote_property(&v, MAX_PROPERTY)))
        .collect();
    SendMessageOptions {
        content_type: content_type.map(str::to_owned),
        broker_properties: Some(SettableBrokerProperties {
            message_id: Some(msg.message_id.clone()),
            session_id: msg.group_id.clone(),
            label: Some(msg.event_type.clone()),
            ..SettableBrokerProperties::default()
        }),
        custom_properties: Some(custom),
    }
}

/// Publishes [`OutboxMessage`]s to queues of one namespace (`destination` is the queue path).
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use txinbox_core::{OutboxMessage, Publisher};
/// use txinbox_servicebus::{ServiceBusConfig, ServiceBusPublisher};
///
/// let client = ServiceBusConfig::from_connection_string(&std::env::var("SERVICEBUS_CONNECTION_STRING")?)?
///     .connect()?;
/// let publisher = ServiceBusPublisher::new(client);
/// publisher
///     .publish(&OutboxMessage {
///         destination: "crm-events".into(),
///         source: "crm/meetings".into(),
///         message_id: "meeting-184-ended".into(),
///         event_type: "crm.meeting.ended".into(),
///         group_id: None,
///         body: br#"{"opportunity":"2481","meeting":"184"}"#.to_vec(),
///         attributes: Default::default(),
///     })
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ServiceBusPublisher {
    client: ServiceBusClient,
    content_type: Option<String>,
}

impl ServiceBusPublisher {
    /// A publisher sending `application/json` bodies.
    pub fn new(client: ServiceBusClient) -> Self {
        Self {
            client,
            content_type: Some("application/json".into()),
        }
    }

    /// Sets the content type sent with every message (`None`: none).
    pub fn content_type(mut self, ct: Option<String>) -> Self {
        self.content_type = ct;
        self
    }

    /// Sends one message.
    ///
    /// A body that is not UTF-8 is refused ([`BrokerErrorKind::Rejected`], source the UTF-8 error): the REST
    /// client sends text only. A 403 ("Quota exceeded or message too large.") is
    /// [`BrokerErrorKind::Throttled`] (retried) for a body of at most
    /// [`ALWAYS_FITS_BODY`](crate::error::ALWAYS_FITS_BODY), which fits every tier (the entity is full), and
    /// [`BrokerErrorKind::Rejected`] for a larger one (it may be too large).
    pub async fn send(&self, msg: &OutboxMessage) -> Result<(), BrokerError> {
        let entity = msg.destination.trim_matches('/');
        let body = std::str::from_utf8(&msg.body)
            .map_err(|e| BrokerError::new(BrokerErrorKind::Rejected, "send", e))?;
        self.client
            .queue_client(entity)
            .send_message(body, Some(send_options(msg, self.content_type.as_deref())))
            .await
            .map_err(|e| send_error("send", e, body.len()))
    }
}

impl Publisher for ServiceBusPublisher {
    async fn publish(&self, msg: &OutboxMessage) -> Result<(), BrokerError> {
        self.send(msg).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_identity_for_message_id_and_cloudevents() {
        let msg = OutboxMessage {
            destination: "q".into(),
            source: "crm".into(),
            message_id: "evt-1".into(),
            event_type: "crm.meeting.ended".into(),
            group_id: Some("opp-2481".into()),
            body: b"{}".to_vec(),
            attributes: [("ce-tenantid".to_owned(), "acme".to_owned())].into(),
        };
        let o = send_options(&msg, Some("application/json"));
        let bp = o.broker_properties.unwrap();
        assert_eq!(bp.message_id.as_deref(), Some("evt-1"));
        assert_eq!(bp.session_id.as_deref(), Some("opp-2481"));
        let c = o.custom_properties.unwrap();
        assert_eq!(c["ce-id"], "\"evt-1\"");
        assert_eq!(c["ce-source"], "\"crm\"");
        assert_eq!(c["ce-type"], "\"crm.meeting.ended\"");
        assert_eq!(c["ce-specversion"], "\"1.0\"");
        assert_eq!(c["ce-tenantid"], "\"acme\"");
    }
}
