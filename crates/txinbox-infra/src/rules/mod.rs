//! The rules. See [`RuleId`] for what each one checks; the semantics of
//! unset attributes follow the providers' defaults (documented per rule in
//! the crate docs).

mod servicebus;
mod sqs;
mod topology;

use hcl::Value;

use crate::terraform::{Module, Resource};
use crate::{RuleId, Violation, WorkerSettings};

use servicebus::check_servicebus_queue;
pub(crate) use servicebus::duration;
use sqs::check_sqs;
pub(crate) use topology::SqsTopology;

pub(crate) fn as_bool(value: &Value) -> Option<bool> {
    match value {
        Value::Bool(b) => Some(*b),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

fn as_u64(value: &Value) -> Option<u64> {
    match value {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

pub(crate) fn show(value: &Value) -> String {
    match value {
        Value::String(s) => format!("{s:?}"),
        other => other.to_string(),
    }
}

pub(crate) struct Checker<'a> {
    pub(crate) module: &'a Module,
    pub(crate) settings: &'a WorkerSettings,
    out: Vec<Violation>,
    pub(crate) advice: Vec<String>,
}

impl Checker<'_> {
    pub(crate) fn report(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        file: usize,
        line: usize,
        message: String,
    ) {
        self.out.push(Violation {
            rule,
            file: self.module.files[file].path.clone(),
            line,
            resource: resource.address(),
            message,
        });
    }

    /// Reports what is missing (no resource to point at): on `line` of the file `file`, under the name
    /// `what`.
    pub(crate) fn report_missing(
        &mut self,
        rule: RuleId,
        file: usize,
        line: usize,
        what: String,
        message: String,
    ) {
        self.out.push(Violation {
            rule,
            file: self.module.files[file].path.clone(),
            line,
            resource: what,
            message,
        });
    }

    /// Reports on the resource's attribute line, or its block line.
    pub(crate) fn at(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        line: Option<usize>,
        message: String,
    ) {
        let line = line.unwrap_or(resource.at.line);
        self.report(rule, resource, resource.at.file, line, message);
    }

    pub(crate) fn unknown(
        &mut self,
        rule: RuleId,
        resource: &Resource,
        key: &str,
        line: usize,
        why: &str,
    ) {
        self.at(
            rule,
            resource,
            Some(line),
            format!("{key} cannot be resolved statically ({why}); set it to a literal or a variable with a default so the guarantee can be checked"),
        );
    }

    /// `FILE:LINE` of a resource, for advice.
    pub(crate) fn place(&self, resource: &Resource) -> String {
        format!(
            "{}:{}",
            self.module.files[resource.at.file].path.display(),
            resource.at.line
        )
    }
}

/// Runs every rule on a loaded module.
pub(crate) fn check(module: &Module, settings: &WorkerSettings) -> (Vec<Violation>, Vec<String>) {
    let mut checker = Checker {
        module,
        settings,
        out: Vec::new(),
        advice: module.notes.clone(),
    };
    check_sqs(&mut checker);
    for queue in module
        .resources
        .iter()
        .filter(|r| r.kind == "azurerm_servicebus_queue")
    {
        check_servicebus_queue(&mut checker, queue);
    }
    crate::roles::check(&mut checker);
    crate::dynamodb::check(&mut checker);
    let mut out = checker.out;
    out.sort_by(|a, b| (&a.file, a.line, a.rule).cmp(&(&b.file, b.line, b.rule)));
    (out, checker.advice)
}
