//! Service Bus: the worker's roles (`servicebus-worker-role-missing`) and the retention path through the
//! poison queue (`servicebus-retention-path-exceeds-inbox`).

use hcl::Value;

use crate::duration::{ceil_secs, human, redelivery_path};
use crate::rules::{duration, Checker};
use crate::terraform::{placeholder, AttrValue, Resolved, Resource};
use crate::RuleId;

/// Roles the Service Bus adapter's worker needs on the queue it consumes
/// (`txinbox_servicebus::roles::QUEUE_ROLES`; a test ties the two lists).
pub const SERVICEBUS_WORKER_QUEUE_ROLES: [&str; 1] = ["Azure Service Bus Data Receiver"];

/// Roles the worker needs on the poison queue it forwards dead letters to
/// (`txinbox_servicebus::roles::POISON_QUEUE_ROLES`).
pub const SERVICEBUS_WORKER_POISON_ROLES: [&str; 1] = ["Azure Service Bus Data Sender"];

/// The role that includes both.
const OWNER: &str = "Azure Service Bus Data Owner";

/// The conventional poison queue suffix (`txinbox_servicebus::roles::POISON_QUEUE_SUFFIX`).
pub const POISON_QUEUE_SUFFIX: &str = "-poison";

struct Assignment<'a> {
    holder: &'a Resource,
    role: String,
    scope: String,
    principal: String,
}

fn known_string(c: &Checker<'_>, r: &Resource, key: &str) -> Option<String> {
    match c.module.resolve(r, key) {
        Resolved::Known {
            value: Value::String(s),
            ..
        } => Some(s),
        _ => None,
    }
}

fn assignments<'a>(c: &Checker<'a>) -> Vec<Assignment<'a>> {
    c.module
        .resources
        .iter()
        .filter(|r| r.mode.is_empty() && r.kind == "azurerm_role_assignment")
        .filter_map(|r| {
            let role = known_string(c, r, "role_definition_name")?;
            let scope = match c.module.resolve(r, "scope") {
                Resolved::Known {
                    value: Value::String(s),
                    ..
                } => s,
                // A plan: the queue's id is known after apply; the reference names the queue.
                Resolved::Unknown { references, .. } => {
                    references.iter().find(|x| x.ends_with(".id")).map(|x| {
                        let (address, attr) = x.rsplit_once('.').unwrap_or((x, "id"));
                        placeholder(address, attr)
                    })?
                }
                _ => return None,
            };
            let principal = known_string(c, r, "principal_id").unwrap_or_else(|| {
                match r.attrs.get("principal_id").map(|a| &a.value) {
                    Some(AttrValue::Expr(e)) => e.to_string(),
                    Some(AttrValue::Unknown { references }) => references.join(","),
                    None => String::new(),
                }
            });
            Some(Assignment {
                holder: r,
                role,
                scope,
                principal,
            })
        })
        .collect()
}

/// Whether a role assignment's scope covers `queue`: the queue itself, its namespace, or an enclosing
/// resource id (resource group, subscription).
fn covers(c: &Checker<'_>, scope: &str, queue: &Resource) -> bool {
    if scope == placeholder(&queue.address(), "id") {
        return true;
    }
    if known_string(c, queue, "namespace_id").is_some_and(|ns| {
        ns == scope || (!ns.starts_with("txinbox-check:") && ns.starts_with(&format!("{scope}/")))
    }) {
        return true;
    }
    known_string(c, queue, "id").is_some_and(|id| {
        !id.starts_with("txinbox-check:") && (id == scope || id.starts_with(&format!("{scope}/")))
    })
}

pub(crate) fn check(c: &mut Checker<'_>) {
    let queues: Vec<&Resource> = c
        .module
        .resources
        .iter()
        .filter(|r| r.mode.is_empty() && r.kind == "azurerm_servicebus_queue")
        .collect();
    if queues.is_empty() {
        return;
    }
    let names: Vec<(Option<String>, &Resource)> = queues
        .iter()
        .map(|q| (known_string(c, q, "name"), *q))
        .collect();
    let by_name = |name: &str| {
        names
            .iter()
            .find(|(n, _)| n.as_deref() == Some(name))
            .map(|(_, q)| *q)
    };
    let configured = c.settings.servicebus.dead_letter_to.clone();
    let is_poison = |name: &Option<String>| {
        name.as_deref().is_some_and(|n| {
            configured.as_deref() == Some(n)
                || n.strip_suffix(POISON_QUEUE_SUFFIX)
                    .is_some_and(|base| names.iter().any(|(m, _)| m.as_deref() == Some(base)))
        })
    };
    let assignments = assignments(c);
    for (name, queue) in &names {
        if is_poison(name) {
            continue;
        }
        // The poison queue the worker of this queue forwards to, if any.
        let poison = match (&configured, name) {
            (Some(to), _) => match by_name(to) {
                Some(p) => Some(p),
                None => {
                    c.at(RuleId::ServiceBusWorkerRoleMissing, queue, None, format!(
                        "the worker forwards dead letters to \"{to}\" (servicebus.dead_letter_to) but no azurerm_servicebus_queue of that name is declared: the forward fails and dead letters stay on this queue until MaxDeliveryCount"
                    ));
                    None
                }
            },
            (None, Some(n)) => by_name(&format!("{n}{POISON_QUEUE_SUFFIX}")),
            (None, None) => None,
        };
        if let Some(poison) = poison {
            check_path(c, queue, poison);
        }
        let receivers: Vec<&Assignment<'_>> = assignments
            .iter()
            .filter(|a| {
                (SERVICEBUS_WORKER_QUEUE_ROLES.contains(&a.role.as_str()) || a.role == OWNER)
                    && covers(c, &a.scope, queue)
            })
            .collect();
        if receivers.is_empty() {
            c.advice.push(format!(
                "{}: {}: no role assignment in what was read gives {} on this queue, so the worker's roles are not checked (SAS, or roles assigned elsewhere)",
                c.place(queue),
                queue.address(),
                SERVICEBUS_WORKER_QUEUE_ROLES.join(", ")
            ));
            continue;
        }
        let Some(poison) = poison else {
            continue;
        };
        for receiver in receivers {
            let has = assignments.iter().any(|a| {
                a.principal == receiver.principal
                    && (SERVICEBUS_WORKER_POISON_ROLES.contains(&a.role.as_str())
                        || a.role == OWNER)
                    && covers(c, &a.scope, poison)
            });
            if !has {
                c.at(RuleId::ServiceBusWorkerRoleMissing, receiver.holder, None, format!(
                    "principal {} receives from {} ({}) but has no {} on its poison queue {}: the worker's forward of a dead letter (ServiceBusOptions::dead_letter_to) is refused, and dead letters stay on the queue until MaxDeliveryCount",
                    receiver.principal,
                    queue.address(),
                    receiver.role,
                    SERVICEBUS_WORKER_POISON_ROLES.join(", "),
                    poison.address()
                ));
            }
        }
    }
}

/// The queue's time to live, then its poison queue's, then the operator's redrive grace: within the inbox
/// retention.
fn check_path(c: &mut Checker<'_>, queue: &Resource, poison: &Resource) {
    const TTL: &str = "default_message_ttl";
    let (Ok(Some((own, own_line, own_shown))), Ok(Some((dead, dead_line, dead_shown)))) = (
        duration(c.module, queue, TTL),
        duration(c.module, poison, TTL),
    ) else {
        // Unset or unusable: servicebus-ttl-exceeds-inbox reports it on each queue.
        return;
    };
    let inbox = c.settings.inbox.retention_seconds;
    let grace = c.settings.inbox.redrive_grace_seconds;
    let path = redelivery_path(ceil_secs(own), Some(ceil_secs(dead)), grace);
    if path > inbox {
        let own_at = format!("{}:{own_line}", c.module.files[queue.at.file].name());
        c.at(RuleId::ServiceBusRetentionPathExceedsInbox, poison, Some(dead_line), format!(
            "the longest redelivery path is {}, longer than the inbox keeps processed markers (inbox.retention_seconds = {}): {} {own_shown} (at {own_at}) + poison queue {dead_shown} + the operator's redrive grace (inbox.redrive_grace_seconds = {}); a message forwarded here and redriven at the end of that path would be processed again as new. Shorten a time to live or keep markers longer",
            human(path),
            human(inbox),
            queue.address(),
            human(grace)
        ));
    }
}
