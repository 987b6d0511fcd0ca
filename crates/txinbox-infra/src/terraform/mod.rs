//! Reads Terraform: a directory (its `*.tf` files, variables files and local modules) or a plan in JSON
//! (`terraform show -json PLAN`, see [`crate::plan`]), into resources with the line of every block and
//! attribute and the scope (module instance) their expressions are evaluated in.
//!
//! Line numbers come from the spans that hcl-rs's own parser (`hcl::edit`,
//! the `hcl-edit` crate that hcl-rs re-exports and uses for `hcl::from_str`)
//! records: each block and attribute carries the byte range it was parsed
//! from, which is mapped to a 1-based line with a table of line starts. No
//! text search is needed, so a commented-out attribute or the same attribute
//! name in another block cannot be picked by mistake.

mod eval;
mod load;

use std::collections::BTreeMap;
use std::path::PathBuf;

use hcl::expr::Expression;
use hcl::Value;

/// Prefix of the placeholder strings that stand for a resource's computed attributes
/// (`aws_sqs_queue.NAME.arn`, `azurerm_servicebus_queue.NAME.id`, `data.aws_iam_policy_document.NAME.json`,
/// inside a module `module.M.aws_sqs_queue.NAME.arn`), so that references between resources can be
/// followed.
const REF_PREFIX: &str = "txinbox-check:";

/// The computed attributes a placeholder is made for.
const REF_ATTRS: [&str; 9] = [
    "arn",
    "id",
    "url",
    "name",
    "json",
    "principal_id",
    "namespace_id",
    "queue_id",
    "object_id",
];

/// One file read (a `.tf`, `.tfvars` or plan JSON file).
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub(crate) path: PathBuf,
    line_starts: Vec<usize>,
}

impl SourceFile {
    pub(crate) fn new(path: PathBuf, text: &str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { path, line_starts }
    }

    /// 1-based line of a byte offset.
    pub(crate) fn line_of(&self, offset: usize) -> usize {
        self.line_starts.partition_point(|&start| start <= offset)
    }

    fn line_of_span(&self, span: Option<std::ops::Range<usize>>) -> usize {
        span.map_or(1, |s| self.line_of(s.start))
    }

    /// The file's name, for messages.
    pub(crate) fn name(&self) -> String {
        self.path.file_name().map_or_else(
            || self.path.display().to_string(),
            |n| n.to_string_lossy().into_owned(),
        )
    }
}

/// Where something is: a file index and a line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Location {
    pub(crate) file: usize,
    pub(crate) line: usize,
}

/// What an attribute holds.
#[derive(Debug, Clone)]
pub(crate) enum AttrValue {
    /// An expression, evaluated in the resource's scope.
    Expr(Expression),
    /// A value a plan does not know yet (`after_unknown`), with the references of its configuration
    /// expression (`aws_sqs_queue.dlq.arn`, `var.x`, ...).
    Unknown { references: Vec<String> },
}

/// An attribute of a resource or of a nested block.
#[derive(Debug, Clone)]
pub(crate) struct Attr {
    pub(crate) value: AttrValue,
    pub(crate) line: usize,
}

/// A nested block (`statement { ... }`, or the `content` of a `dynamic "statement"`).
#[derive(Debug, Clone)]
pub(crate) struct NestedBlock {
    pub(crate) ident: String,
    pub(crate) attrs: BTreeMap<String, Attr>,
    /// The kinds of the blocks nested in it (`condition` in a `statement`).
    pub(crate) children: Vec<String>,
    /// A `dynamic` block: its content depends on an iterator this reader does not expand.
    pub(crate) dynamic: bool,
    /// A `dynamic` block's `for_each`: how many blocks it makes (none for an empty collection).
    pub(crate) for_each: Option<Attr>,
    /// 1-based line of the block's first line.
    pub(crate) line: usize,
}

/// A `resource "KIND" "NAME"` or `data "KIND" "NAME"` block.
#[derive(Debug)]
pub(crate) struct Resource {
    /// `data.` for a data source, empty for a managed resource.
    pub(crate) mode: &'static str,
    pub(crate) kind: String,
    pub(crate) name: String,
    /// `module.NAME.` per enclosing module call; empty in the root module.
    pub(crate) module: String,
    /// Index of the scope its expressions are evaluated in.
    pub(crate) scope: usize,
    pub(crate) at: Location,
    pub(crate) attrs: BTreeMap<String, Attr>,
    pub(crate) blocks: Vec<NestedBlock>,
}

impl Resource {
    /// The address as Terraform prints it: `module.queues.aws_sqs_queue.main`, `data.KIND.NAME`.
    pub(crate) fn address(&self) -> String {
        format!("{}{}{}.{}", self.module, self.mode, self.kind, self.name)
    }
}

/// What an attribute evaluates to.
#[derive(Debug)]
pub(crate) enum Resolved {
    /// The attribute is not set.
    Missing,
    /// The value, and where a `var.x`/`local.x` it came from is set.
    Known {
        value: Value,
        line: usize,
        origin: String,
    },
    /// The value cannot be known without planning (e.g. it depends on a
    /// variable without default or on a function this checker does not know),
    /// or a plan says it is known only after apply (`references` then lists what it depends on).
    Unknown {
        line: usize,
        why: String,
        references: Vec<String>,
    },
}

/// The variables, locals and module outputs of one module instance.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    /// `module.NAME.` prefix of this instance (empty for the root).
    prefix: String,
    vars: hcl::Map<String, Value>,
    var_origins: BTreeMap<String, Location>,
    locals: hcl::Map<String, Value>,
    local_origins: BTreeMap<String, Location>,
    /// Outputs of the module calls in this scope, by call name.
    modules: hcl::Map<String, Value>,
    /// (mode, kind, name, whether it has `count`) of the resources declared in this scope.
    declared: Vec<(&'static str, String, String, bool)>,
}

/// What was read: one module with its local child modules, or a plan.
#[derive(Debug, Default)]
pub(crate) struct Module {
    pub(crate) files: Vec<SourceFile>,
    pub(crate) resources: Vec<Resource>,
    pub(crate) scopes: Vec<Scope>,
    /// What could not be read and why (a registry module, a module nested too deep): reported as
    /// advisories, since what is in them is not checked.
    pub(crate) notes: Vec<String>,
}

/// The placeholder string of `address`'s attribute `attr`.
pub(crate) fn placeholder(address: &str, attr: &str) -> String {
    format!("{REF_PREFIX}{address}.{attr}")
}

/// The resource address and attribute a placeholder string stands for.
pub(crate) fn referenced(value: &str) -> Option<(&str, &str)> {
    value.strip_prefix(REF_PREFIX)?.rsplit_once('.')
}

/// The resource address a placeholder string stands for.
pub(crate) fn referenced_resource(value: &str) -> Option<&str> {
    referenced(value).map(|(address, _)| address)
}
