//! Reads a Terraform directory: files, variables, locals and resources, with
//! the line of every block and attribute.
//!
//! Line numbers come from the spans that hcl-rs's own parser (`hcl::edit`,
//! the `hcl-edit` crate that hcl-rs re-exports and uses for `hcl::from_str`)
//! records: each block and attribute carries the byte range it was parsed
//! from, which is mapped to a 1-based line with a table of line starts. No
//! text search is needed, so a commented-out attribute or the same attribute
//! name in another block cannot be picked by mistake.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcl::edit::structure::{Block, Body, Structure};
use hcl::edit::Span;
use hcl::eval::{Context, Evaluate, FuncArgs, FuncDef, ParamType};
use hcl::expr::{Expression, TraversalOperator};
use hcl::Value;

use crate::CheckError;

/// Prefix of the placeholder strings that stand for a queue's computed
/// attributes (`aws_sqs_queue.NAME.arn`, `.id`, `.url`), so that a redrive
/// policy can be evaluated and its target queue recognised.
const QUEUE_REF_PREFIX: &str = "txinbox-check:aws_sqs_queue.";

/// One file of the directory.
#[derive(Debug)]
pub(crate) struct SourceFile {
    pub(crate) path: PathBuf,
    line_starts: Vec<usize>,
}

impl SourceFile {
    fn new(path: PathBuf, text: &str) -> Self {
        let line_starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(i, _)| i + 1))
            .collect();
        Self { path, line_starts }
    }

    /// 1-based line of a byte offset.
    fn line_of(&self, offset: usize) -> usize {
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

/// An attribute of a resource.
#[derive(Debug)]
pub(crate) struct Attr {
    pub(crate) expr: Expression,
    pub(crate) line: usize,
}

/// A `resource "KIND" "NAME"` block.
#[derive(Debug)]
pub(crate) struct Resource {
    pub(crate) kind: String,
    pub(crate) name: String,
    pub(crate) at: Location,
    pub(crate) attrs: BTreeMap<String, Attr>,
}

impl Resource {
    /// `KIND.NAME`.
    pub(crate) fn address(&self) -> String {
        format!("{}.{}", self.kind, self.name)
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
    /// variable without default or on a function this checker does not know).
    Unknown { line: usize, why: String },
}

/// A parsed Terraform directory (one module, like Terraform: no recursion).
#[derive(Debug)]
pub(crate) struct Module {
    pub(crate) files: Vec<SourceFile>,
    pub(crate) resources: Vec<Resource>,
    vars: hcl::Map<String, Value>,
    var_origins: BTreeMap<String, Location>,
    locals: hcl::Map<String, Value>,
    local_origins: BTreeMap<String, Location>,
    queue_names: Vec<String>,
}

fn read(path: &Path) -> Result<String, CheckError> {
    std::fs::read_to_string(path).map_err(|source| CheckError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse(path: &Path, text: &str) -> Result<Body, CheckError> {
    hcl::edit::parser::parse_body(text).map_err(|source| CheckError::Parse {
        file: path.to_path_buf(),
        source,
    })
}

fn labels(block: &Block) -> Vec<&str> {
    block.labels.iter().map(|l| l.as_str()).collect()
}

/// `jsonencode(value)`, enough for redrive policies.
fn jsonencode(args: FuncArgs) -> Result<Value, String> {
    let value = args.into_values().into_iter().next().unwrap_or(Value::Null);
    serde_json::to_string(&value)
        .map(Value::String)
        .map_err(|e| e.to_string())
}

impl Module {
    /// Reads every `*.tf` file of `dir` (sorted by name), then the variable
    /// values Terraform loads by itself: `terraform.tfvars` and `*.auto.tfvars`.
    pub(crate) fn load(dir: &Path) -> Result<Self, CheckError> {
        let io = |source| CheckError::Io {
            path: dir.to_path_buf(),
            source,
        };
        let mut tf = Vec::new();
        let mut auto_tfvars = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(io)? {
            let path = entry.map_err(io)?.path();
            if !path.is_file() {
                continue;
            }
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if name.ends_with(".tf") {
                tf.push(path);
            } else if name.ends_with(".auto.tfvars") {
                auto_tfvars.push(path);
            }
        }
        if tf.is_empty() {
            return Err(CheckError::NoTerraformFiles {
                dir: dir.to_path_buf(),
            });
        }
        tf.sort();
        auto_tfvars.sort();

        let mut module = Module {
            files: Vec::new(),
            resources: Vec::new(),
            vars: hcl::Map::new(),
            var_origins: BTreeMap::new(),
            locals: hcl::Map::new(),
            local_origins: BTreeMap::new(),
            queue_names: Vec::new(),
        };
        let mut pending_locals: Vec<(String, Expression, Location)> = Vec::new();

        for path in tf {
            let text = read(&path)?;
            let body = parse(&path, &text)?;
            let file = SourceFile::new(path, &text);
            let index = module.files.len();
            for structure in body.iter() {
                let Structure::Block(block) = structure else {
                    continue;
                };
                match (block.ident.as_str(), labels(block).as_slice()) {
                    ("variable", [name]) => {
                        if let Some(default) = block.body.get_attribute("default") {
                            let at = Location {
                                file: index,
                                line: file.line_of_span(default.span()),
                            };
                            module.set_var(name, Expression::from(default.value.clone()), at);
                        }
                    }
                    ("locals", []) => {
                        for attr in block.body.attributes() {
                            pending_locals.push((
                                attr.key.as_str().to_owned(),
                                Expression::from(attr.value.clone()),
                                Location {
                                    file: index,
                                    line: file.line_of_span(attr.span()),
                                },
                            ));
                        }
                    }
                    ("resource", [kind, name]) => {
                        let attrs = block
                            .body
                            .attributes()
                            .map(|attr| {
                                (
                                    attr.key.as_str().to_owned(),
                                    Attr {
                                        expr: Expression::from(attr.value.clone()),
                                        line: file.line_of_span(attr.span()),
                                    },
                                )
                            })
                            .collect();
                        module.resources.push(Resource {
                            kind: (*kind).to_owned(),
                            name: (*name).to_owned(),
                            at: Location {
                                file: index,
                                line: file.line_of_span(block.span()),
                            },
                            attrs,
                        });
                    }
                    _ => {}
                }
            }
            module.files.push(file);
        }

        let tfvars = dir.join("terraform.tfvars");
        let tfvars = tfvars.is_file().then_some(tfvars);
        for path in tfvars.into_iter().chain(auto_tfvars) {
            let text = read(&path)?;
            let body = parse(&path, &text)?;
            let file = SourceFile::new(path, &text);
            let index = module.files.len();
            for attr in body.attributes() {
                let at = Location {
                    file: index,
                    line: file.line_of_span(attr.span()),
                };
                module.set_var(attr.key.as_str(), Expression::from(attr.value.clone()), at);
            }
            module.files.push(file);
        }

        module.queue_names = module
            .resources
            .iter()
            .filter(|r| r.kind == "aws_sqs_queue")
            .map(|r| r.name.clone())
            .collect();

        // Locals may use variables, queues and other locals: evaluate until
        // no more can be resolved. What is left stays unknown.
        loop {
            let ctx = module.context();
            let before = pending_locals.len();
            let mut still = Vec::new();
            for (name, expr, at) in pending_locals {
                match expr.evaluate(&ctx) {
                    Ok(value) => {
                        module.locals.insert(name.clone(), value);
                        module.local_origins.insert(name, at);
                    }
                    Err(_) => still.push((name, expr, at)),
                }
            }
            pending_locals = still;
            if pending_locals.is_empty() || pending_locals.len() == before {
                break;
            }
        }
        Ok(module)
    }

    /// Sets a variable's value from a default or a `.tfvars` file. Such
    /// values are literals: a value that does not evaluate on its own makes
    /// the variable unknown.
    fn set_var(&mut self, name: &str, expr: Expression, at: Location) {
        match expr.evaluate(&Context::new()) {
            Ok(value) => {
                self.vars.insert(name.to_owned(), value);
            }
            Err(_) => {
                self.vars.shift_remove(name);
            }
        }
        self.var_origins.insert(name.to_owned(), at);
    }

    fn context(&self) -> Context<'static> {
        let mut ctx = Context::new();
        ctx.declare_var("var", Value::Object(self.vars.clone()));
        ctx.declare_var("local", Value::Object(self.locals.clone()));
        let queues: hcl::Map<String, Value> = self
            .queue_names
            .iter()
            .map(|name| {
                let attrs: hcl::Map<String, Value> = ["arn", "id", "url"]
                    .into_iter()
                    .map(|a| {
                        (
                            a.to_owned(),
                            Value::String(format!("{QUEUE_REF_PREFIX}{name}.{a}")),
                        )
                    })
                    .collect();
                (name.clone(), Value::Object(attrs))
            })
            .collect();
        ctx.declare_var("aws_sqs_queue", Value::Object(queues));
        ctx.declare_func(
            "jsonencode",
            FuncDef::builder().param(ParamType::Any).build(jsonencode),
        );
        ctx
    }

    /// Evaluates a resource's attribute.
    pub(crate) fn resolve(&self, resource: &Resource, key: &str) -> Resolved {
        let Some(attr) = resource.attrs.get(key) else {
            return Resolved::Missing;
        };
        match attr.expr.evaluate(&self.context()) {
            Ok(value) => Resolved::Known {
                value,
                line: attr.line,
                origin: self.origin(&attr.expr),
            },
            Err(e) => Resolved::Unknown {
                line: attr.line,
                why: e.to_string().lines().next().unwrap_or_default().to_owned(),
            },
        }
    }

    /// ` (var.x, set at variables.tf:12)` when the expression is exactly a
    /// variable or a local; empty otherwise.
    fn origin(&self, expr: &Expression) -> String {
        let Expression::Traversal(traversal) = expr else {
            return String::new();
        };
        let (Expression::Variable(root), [TraversalOperator::GetAttr(name)]) =
            (&traversal.expr, traversal.operators.as_slice())
        else {
            return String::new();
        };
        let origins = match root.as_str() {
            "var" => &self.var_origins,
            "local" => &self.local_origins,
            _ => return String::new(),
        };
        match origins.get(name.as_str()) {
            Some(at) => format!(
                " ({}.{}, set at {}:{})",
                root.as_str(),
                name.as_str(),
                self.files[at.file].name(),
                at.line
            ),
            None => String::new(),
        }
    }
}

/// The queue a placeholder string from [`Module::context`] stands for.
pub(crate) fn referenced_queue(value: &str) -> Option<&str> {
    let rest = value.strip_prefix(QUEUE_REF_PREFIX)?;
    Some(rest.rsplit_once('.').map_or(rest, |(name, _)| name))
}
