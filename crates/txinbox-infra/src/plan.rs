//! Reads a plan in Terraform's JSON output format (`terraform show -json PLAN`): the resources of
//! `planned_values.root_module` and its `child_modules` (with `address`, `mode`, `type`, `name`,
//! `values`), the attributes `resource_changes[].change.after_unknown` marks as known only after apply,
//! and, for those, the `references` of their expressions in `configuration` (`root_module.resources[]`,
//! `module_calls.NAME.module`).
//!
//! A plan has every module (local or from a registry) expanded, every variable and `count`/`for_each`
//! resolved: this is how check-infra reads modules it cannot fetch.

use std::collections::BTreeMap;
use std::path::Path;

use hcl::expr::Expression;
use hcl::Value;
use serde_json::Value as Json;

use crate::terraform::{Attr, AttrValue, Location, Module, Resource, SourceFile};
use crate::CheckError;

fn to_hcl(json: &Json) -> Value {
    match json {
        Json::Null => Value::Null,
        Json::Bool(b) => Value::Bool(*b),
        Json::Number(n) => n
            .as_u64()
            .map(Value::from)
            .or_else(|| n.as_i64().map(Value::from))
            .or_else(|| n.as_f64().map(Value::from))
            .unwrap_or(Value::Null),
        Json::String(s) => Value::String(s.clone()),
        Json::Array(items) => Value::Array(items.iter().map(to_hcl).collect()),
        Json::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), to_hcl(v))).collect())
        }
    }
}

/// Where in the text things are, to give lines (meaningful when the JSON is pretty-printed, e.g. by
/// `jq .`; `terraform show -json` writes one line).
struct Lines<'a> {
    text: &'a str,
    file: &'a SourceFile,
    planned_at: usize,
}

impl Lines<'_> {
    /// The line of `"address": "ADDRESS"` in `planned_values`, and its byte offset.
    fn resource(&self, address: &str) -> (usize, usize) {
        let needle = format!("\"{}\"", address.replace('"', "\\\""));
        match self.text[self.planned_at..].find(&needle) {
            Some(i) => (self.file.line_of(self.planned_at + i), self.planned_at + i),
            None => (1, self.planned_at),
        }
    }

    /// The line of `"KEY"` after `from`.
    fn key(&self, key: &str, from: usize) -> usize {
        let needle = format!("\"{key}\"");
        self.text[from..]
            .find(&needle)
            .map_or(1, |i| self.file.line_of(from + i))
    }
}

/// `configuration` of one module: resource address -> attribute -> references.
type Config = BTreeMap<String, BTreeMap<String, Vec<String>>>;

/// Collects the references of every resource's expressions, per module prefix (`module.a.module.b.`);
/// references are made absolute (prefixed) except `var.`, `local.`, `each.`, `count.`, `path.`.
fn configuration(module: &Json, prefix: &str, out: &mut BTreeMap<String, Config>) {
    let absolute = |r: &str| {
        if ["var.", "local.", "each.", "count.", "path.", "self."]
            .iter()
            .any(|p| r.starts_with(p))
        {
            r.to_owned()
        } else {
            format!("{prefix}{r}")
        }
    };
    let config = out.entry(prefix.to_owned()).or_default();
    for r in module
        .get("resources")
        .and_then(Json::as_array)
        .into_iter()
        .flatten()
    {
        let Some(address) = r.get("address").and_then(Json::as_str) else {
            continue;
        };
        let mut attrs = BTreeMap::new();
        if let Some(Json::Object(exprs)) = r.get("expressions") {
            for (key, expr) in exprs {
                let refs: Vec<String> = expr
                    .get("references")
                    .and_then(Json::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(Json::as_str)
                    .map(absolute)
                    .collect();
                attrs.insert(key.clone(), refs);
            }
        }
        config.insert(format!("{prefix}{address}"), attrs);
    }
    if let Some(Json::Object(calls)) = module.get("module_calls") {
        for (name, call) in calls {
            if let Some(child) = call.get("module") {
                configuration(child, &format!("{prefix}module.{name}."), out);
            }
        }
    }
}

/// An address without its instance keys (`module.q[0].aws_sqs_queue.this[0]` -> `module.q.aws_sqs_queue.this`),
/// as `configuration` names it.
fn unindexed(address: &str) -> String {
    let mut out = String::with_capacity(address.len());
    let mut depth = 0usize;
    let mut quoted = false;
    for ch in address.chars() {
        match ch {
            '"' if depth > 0 => quoted = !quoted,
            '[' if !quoted => depth += 1,
            ']' if !quoted && depth > 0 => depth -= 1,
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    out
}

fn bad(path: &Path, detail: impl Into<String>) -> CheckError {
    CheckError::Plan {
        file: path.to_path_buf(),
        detail: detail.into(),
    }
}

impl Module {
    /// Reads a plan JSON file.
    pub(crate) fn load_plan(path: &Path) -> Result<Self, CheckError> {
        let text = std::fs::read_to_string(path).map_err(|source| CheckError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let json: Json =
            serde_json::from_str(&text).map_err(|e| bad(path, format!("not valid JSON ({e})")))?;
        if json.get("format_version").is_none() {
            return Err(bad(
                path,
                "no format_version: not the output of `terraform show -json PLAN`",
            ));
        }
        let root = json
            .get("planned_values")
            .and_then(|p| p.get("root_module"))
            .ok_or_else(|| bad(path, "no planned_values.root_module"))?;

        let mut config = BTreeMap::new();
        if let Some(c) = json.get("configuration").and_then(|c| c.get("root_module")) {
            configuration(c, "", &mut config);
        }
        let mut unknown: BTreeMap<String, Vec<String>> = BTreeMap::new();
        let mut deferred = Vec::new();
        for change in json
            .get("resource_changes")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
        {
            let reads = change
                .get("change")
                .and_then(|c| c.get("actions"))
                .and_then(Json::as_array)
                .is_some_and(|a| a.iter().any(|x| x == "read"));
            if let (Some(address), Some("data"), true) = (
                change.get("address").and_then(Json::as_str),
                change.get("mode").and_then(Json::as_str),
                reads,
            ) {
                deferred.push(address.to_owned());
            }
        }
        for change in json
            .get("resource_changes")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
        {
            let (Some(address), Some(Json::Object(after_unknown))) = (
                change.get("address").and_then(Json::as_str),
                change.get("change").and_then(|c| c.get("after_unknown")),
            ) else {
                continue;
            };
            unknown.insert(
                address.to_owned(),
                after_unknown
                    .iter()
                    .filter(|(_, v)| **v == Json::Bool(true))
                    .map(|(k, _)| k.clone())
                    .collect(),
            );
        }

        let file = SourceFile::new(path.to_path_buf(), &text);
        let lines = Lines {
            text: &text,
            file: &file,
            planned_at: text.find("\"planned_values\"").unwrap_or(0),
        };
        let mut module = Module::default();
        let mut stack = vec![(root, String::new())];
        let mut found = Vec::new();
        while let Some((m, prefix)) = stack.pop() {
            let scope = module.add_scope(prefix.clone());
            for r in m
                .get("resources")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                let get = |k| r.get(k).and_then(Json::as_str);
                let (Some(address), Some(kind), Some(name)) =
                    (get("address"), get("type"), get("name"))
                else {
                    return Err(bad(
                        path,
                        "a resource in planned_values without address, type or name",
                    ));
                };
                let mode = if get("mode") == Some("data") {
                    "data."
                } else {
                    ""
                };
                let name = match r.get("index") {
                    Some(Json::Number(n)) => format!("{name}[{n}]"),
                    Some(Json::String(s)) => format!("{name}[{s:?}]"),
                    _ => name.to_owned(),
                };
                let (line, offset) = lines.resource(address);
                let mut attrs = BTreeMap::new();
                if let Some(Json::Object(values)) = r.get("values") {
                    for (key, value) in values {
                        if value.is_null() {
                            continue;
                        }
                        attrs.insert(
                            key.clone(),
                            Attr {
                                value: AttrValue::Expr(Expression::from(to_hcl(value))),
                                line: lines.key(key, offset),
                            },
                        );
                    }
                }
                // What the plan knows only after apply, with what it depends on.
                let config_address = unindexed(address);
                for key in unknown.get(address).into_iter().flatten() {
                    let references = config
                        .get(&unindexed(&prefix))
                        .and_then(|c| c.get(&config_address))
                        .and_then(|c| c.get(key))
                        .cloned()
                        .unwrap_or_default();
                    attrs.insert(
                        key.clone(),
                        Attr {
                            value: AttrValue::Unknown { references },
                            line,
                        },
                    );
                }
                found.push(Resource {
                    mode,
                    kind: kind.to_owned(),
                    name,
                    module: prefix.clone(),
                    scope,
                    at: Location { file: 0, line },
                    attrs,
                    blocks: Vec::new(),
                });
            }
            for child in m
                .get("child_modules")
                .and_then(Json::as_array)
                .into_iter()
                .flatten()
            {
                let address = child
                    .get("address")
                    .and_then(Json::as_str)
                    .ok_or_else(|| bad(path, "a child module without address"))?;
                stack.push((child, format!("{address}.")));
            }
        }
        for address in deferred {
            if found.iter().all(|r| r.address() != address)
                && address.contains("aws_iam_policy_document")
            {
                module.notes.push(format!(
                    "{}: {address} is read only at apply (it depends on values known after apply), so the policy it builds is not checked in this plan; check a plan made once the queues exist",
                    path.display()
                ));
            }
        }
        for r in found {
            module.add_resource(r);
        }
        module.files.push(file);
        Ok(module)
    }
}

#[cfg(test)]
mod tests {
    use super::unindexed;

    #[test]
    fn instance_keys_are_dropped() {
        assert_eq!(
            unindexed("module.q[0].aws_sqs_queue.this[0]"),
            "module.q.aws_sqs_queue.this"
        );
        assert_eq!(
            unindexed(r#"azurerm_servicebus_queue.base_queues["a[b]"]"#),
            "azurerm_servicebus_queue.base_queues"
        );
        assert_eq!(unindexed("aws_sqs_queue.main"), "aws_sqs_queue.main");
    }
}
