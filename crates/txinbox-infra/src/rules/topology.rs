//! The SQS topology of a module: its queues, their redrive policies and which are dead-letter queues.

use std::collections::{BTreeMap, BTreeSet};

use hcl::Value;

use super::show;
use crate::terraform::{referenced_resource, Module, Resolved, Resource};

/// A redrive policy: on the queue or in an `aws_sqs_queue_redrive_policy`.
pub(super) struct Redrive<'a> {
    pub(super) holder: &'a Resource,
    pub(super) resolved: Resolved,
}

/// What a readable redrive policy says.
pub(super) struct RedriveTarget {
    /// The dead-letter queue's address when it is a queue of what was read.
    pub(super) dlq: Option<String>,
    pub(super) max_receive_count: Option<u64>,
    pub(super) has_target: bool,
    /// The ARN of a dead-letter queue that is not in what was read (another state, a literal ARN).
    pub(super) external: Option<String>,
}

/// The address of the queue of `module` an ARN (or placeholder) names.
fn queue_by_arn(module: &Module, arn: &str) -> Option<String> {
    if let Some(address) = referenced_resource(arn) {
        return Some(address.to_owned());
    }
    let name = arn.rsplit(':').next()?;
    module
        .resources
        .iter()
        .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
        .find(|q| {
            let known = |key| match module.resolve(q, key) {
                Resolved::Known {
                    value: Value::String(s),
                    ..
                } => Some(s),
                _ => None,
            };
            known("arn").is_some_and(|a| a == arn) || known("name").is_some_and(|n| n == name)
        })
        .map(Resource::address)
}

pub(super) fn read_redrive(module: &Module, value: &Value) -> Result<RedriveTarget, String> {
    let Value::String(text) = value else {
        return Err(format!(
            "redrive_policy is {}, not a JSON string",
            show(value)
        ));
    };
    let json: serde_json::Value = serde_json::from_str(text)
        .map_err(|e| format!("redrive_policy is not valid JSON ({e})"))?;
    let target = json
        .get("deadLetterTargetArn")
        .and_then(|v| v.as_str())
        .filter(|s| !s.is_empty());
    let max = json.get("maxReceiveCount").and_then(|v| match v {
        serde_json::Value::Number(n) => n.as_u64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    });
    let dlq = target.and_then(|arn| queue_by_arn(module, arn));
    Ok(RedriveTarget {
        external: target
            .filter(|arn| dlq.is_none() && referenced_resource(arn).is_none())
            .map(str::to_owned),
        dlq,
        max_receive_count: max,
        has_target: target.is_some(),
    })
}

fn queue_of(module: &Module, resource: &Resource) -> Option<String> {
    match module.resolve(resource, "queue_url") {
        Resolved::Known {
            value: Value::String(s),
            ..
        } => referenced_resource(&s).map(str::to_owned).or_else(|| {
            // A plan's known URL: https://sqs.REGION.amazonaws.com/ACCOUNT/NAME
            let name = s.rsplit('/').next()?;
            module
                .resources
                .iter()
                .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
                .find(|q| {
                    matches!(module.resolve(q, "url"), Resolved::Known { value: Value::String(u), .. } if u == s)
                        || matches!(module.resolve(q, "name"), Resolved::Known { value: Value::String(n), .. } if n == name)
                })
                .map(Resource::address)
        }),
        Resolved::Unknown { references, .. } => references
            .iter()
            .find(|r| r.contains("aws_sqs_queue."))
            .map(|r| strip_attr(r)),
        Resolved::Known { .. } | Resolved::Missing => None,
    }
}

/// `aws_sqs_queue.dlq` of a plan reference `aws_sqs_queue.dlq.arn` (references list both forms).
pub(super) fn strip_attr(reference: &str) -> String {
    let parts: Vec<&str> = reference.split('.').collect();
    // module.M.KIND.NAME[.ATTR] or KIND.NAME[.ATTR]
    let mut n = 0;
    let mut i = 0;
    while i + 1 < parts.len() && parts[i] == "module" {
        i += 2;
        n += 2;
    }
    n += if parts.get(i) == Some(&"data") { 3 } else { 2 };
    parts[..n.min(parts.len())].join(".")
}

/// Whether a redrive allow policy lets some queue use its queue as a dead-letter queue: set, and not
/// `redrivePermission = "denyAll"` (AWS: "No source queues can specify this queue as the dead-letter queue").
/// A queue that denies them all is a queue like any other, checked as one.
fn allows_redrive(resolved: &Resolved) -> bool {
    match resolved {
        Resolved::Missing
        | Resolved::Known {
            value: Value::Null, ..
        } => false,
        // A plan shows an unset policy as "".
        Resolved::Known {
            value: Value::String(s),
            ..
        } => {
            !s.is_empty()
                && serde_json::from_str::<serde_json::Value>(s)
                    .ok()
                    .is_none_or(|json| {
                        json.get("redrivePermission").and_then(|p| p.as_str()) != Some("denyAll")
                    })
        }
        _ => true,
    }
}

/// The queues of an SQS module: which are dead-letter queues, which redrive policy each source has.
pub(crate) struct SqsTopology<'a> {
    pub(crate) queues: Vec<&'a Resource>,
    pub(super) redrives: Vec<(String, Redrive<'a>)>,
    pub(crate) dlqs: BTreeSet<String>,
    /// Source queue address -> its dead-letter queue's address, where known.
    pub(crate) dlq_of: BTreeMap<String, String>,
    /// Source queue address -> the ARN of its dead-letter queue when that queue is not in what was read.
    pub(crate) external_dlq: BTreeMap<String, String>,
}

pub(crate) fn sqs_topology(module: &Module) -> SqsTopology<'_> {
    let queues: Vec<&Resource> = module
        .resources
        .iter()
        .filter(|r| r.kind == "aws_sqs_queue" && r.mode.is_empty())
        .collect();
    let mut redrives: Vec<(String, Redrive<'_>)> = Vec::new();
    let mut dlqs = BTreeSet::new();
    // A plan shows an unset policy as "".
    let set = |resolved: &Resolved| match resolved {
        Resolved::Missing => false,
        Resolved::Known {
            value: Value::String(s),
            ..
        } => !s.is_empty(),
        Resolved::Known {
            value: Value::Null, ..
        } => false,
        _ => true,
    };
    for queue in &queues {
        if allows_redrive(&module.resolve(queue, "redrive_allow_policy")) {
            dlqs.insert(queue.address());
        }
        let resolved = module.resolve(queue, "redrive_policy");
        if set(&resolved) {
            redrives.push((
                queue.address(),
                Redrive {
                    holder: queue,
                    resolved,
                },
            ));
        }
    }
    for resource in module.resources.iter().filter(|r| r.mode.is_empty()) {
        match resource.kind.as_str() {
            "aws_sqs_queue_redrive_policy" => {
                if let Some(address) = queue_of(module, resource) {
                    let resolved = module.resolve(resource, "redrive_policy");
                    redrives.push((
                        address,
                        Redrive {
                            holder: resource,
                            resolved,
                        },
                    ));
                }
            }
            "aws_sqs_queue_redrive_allow_policy"
                if allows_redrive(&module.resolve(resource, "redrive_allow_policy")) =>
            {
                if let Some(address) = queue_of(module, resource) {
                    dlqs.insert(address);
                }
            }
            _ => {}
        }
    }
    let mut dlq_of = BTreeMap::new();
    let mut external_dlq = BTreeMap::new();
    for (source, redrive) in &redrives {
        let dlq = match &redrive.resolved {
            Resolved::Known { value, .. } => match read_redrive(module, value) {
                Ok(RedriveTarget {
                    external: Some(arn),
                    ..
                }) => {
                    external_dlq.insert(source.clone(), arn);
                    None
                }
                Ok(t) => t.dlq,
                Err(_) => None,
            },
            // A plan: the policy is known after apply; its references name the dead-letter queue.
            Resolved::Unknown { references, .. } => references
                .iter()
                .find(|r| r.contains("aws_sqs_queue.") && !r.contains("redrive"))
                .map(|r| strip_attr(r))
                .filter(|a| queues.iter().any(|q| q.address() == *a)),
            Resolved::Missing => None,
        };
        if let Some(dlq) = dlq {
            dlqs.insert(dlq.clone());
            dlq_of.insert(source.clone(), dlq);
        }
    }
    SqsTopology {
        queues,
        redrives,
        dlqs,
        dlq_of,
        external_dlq,
    }
}
