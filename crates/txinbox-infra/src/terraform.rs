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

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcl::edit::structure::{Block, Body, Structure};
use hcl::edit::Span;
use hcl::eval::{Context, Evaluate, FuncArgs, FuncDef, ParamType};
use hcl::expr::{Expression, TraversalOperator};
use hcl::Value;

use crate::CheckError;

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

/// How deep local modules may nest.
const MAX_MODULE_DEPTH: usize = 8;

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
    /// A `dynamic` block: its content depends on an iterator this reader does not expand.
    pub(crate) dynamic: bool,
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

fn read(path: &Path) -> Result<String, CheckError> {
    std::fs::read_to_string(path).map_err(|source| CheckError::Io {
        path: path.to_path_buf(),
        source,
    })
}

fn parse(path: &Path, text: &str) -> Result<Body, CheckError> {
    // In linear time first: the parser backtracks exponentially on some unbalanced input.
    crate::shape::check(text).map_err(|e| CheckError::Shape {
        file: path.to_path_buf(),
        line: e.line,
        detail: e.detail,
    })?;
    hcl::edit::parser::parse_body(text).map_err(|source| CheckError::Parse {
        file: path.to_path_buf(),
        source,
    })
}

fn labels(block: &Block) -> Vec<&str> {
    block.labels.iter().map(|l| l.as_str()).collect()
}

/// `jsonencode(value)`.
fn jsonencode(args: FuncArgs) -> Result<Value, String> {
    let value = args.into_values().into_iter().next().unwrap_or(Value::Null);
    serde_json::to_string(&value)
        .map(Value::String)
        .map_err(|e| e.to_string())
}

/// A module input evaluated in the caller's scope: name, value (or why it is unknown), where it is set.
type ModuleInput = (String, Result<Value, String>, Location);

/// A module call found in a directory, to be loaded once its inputs can be evaluated.
struct ModuleCall {
    name: String,
    source: Option<Expression>,
    inputs: Vec<(String, Expression, Location)>,
    at: Location,
}

/// What one directory declares, before evaluation.
struct DirContents {
    locals: Vec<(String, Expression, Location)>,
    outputs: Vec<(String, Expression)>,
    calls: Vec<ModuleCall>,
}

fn attrs_of(body: &Body, file: &SourceFile) -> BTreeMap<String, Attr> {
    body.attributes()
        .map(|attr| {
            (
                attr.key.as_str().to_owned(),
                Attr {
                    value: AttrValue::Expr(Expression::from(attr.value.clone())),
                    line: file.line_of_span(attr.span()),
                },
            )
        })
        .collect()
}

fn nested_blocks(body: &Body, file: &SourceFile) -> Vec<NestedBlock> {
    let mut out = Vec::new();
    for block in body.blocks() {
        match (block.ident.as_str(), labels(block).as_slice()) {
            ("dynamic", [ident]) => {
                if let Some(content) = block.body.blocks().find(|b| b.ident.as_str() == "content") {
                    out.push(NestedBlock {
                        ident: (*ident).to_owned(),
                        attrs: attrs_of(&content.body, file),
                        dynamic: true,
                        line: file.line_of_span(block.span()),
                    });
                }
            }
            (ident, _) => out.push(NestedBlock {
                ident: ident.to_owned(),
                attrs: attrs_of(&block.body, file),
                dynamic: false,
                line: file.line_of_span(block.span()),
            }),
        }
    }
    out
}

impl Module {
    /// Reads the Terraform directory `dir`: every `*.tf` file (sorted by name), then the variable values
    /// Terraform loads by itself (`terraform.tfvars`, then `*.auto.tfvars` in name order), then
    /// `var_files` in the order given (later files win, as with `terraform plan -var-file`). Module calls
    /// with a local `source` (`./...`, `../...`) are read recursively with their inputs; other sources
    /// are noted, not fetched.
    pub(crate) fn load(dir: &Path, var_files: &[PathBuf]) -> Result<Self, CheckError> {
        let mut module = Module::default();
        module.load_dir(dir, String::new(), var_files, None, 0)?;
        Ok(module)
    }

    /// Loads one module instance: a new scope, its resources, its child modules; returns the scope index.
    fn load_dir(
        &mut self,
        dir: &Path,
        prefix: String,
        var_files: &[PathBuf],
        inputs: Option<Vec<ModuleInput>>,
        depth: usize,
    ) -> Result<(usize, Vec<(String, Expression)>), CheckError> {
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

        let scope = self.scopes.len();
        self.scopes.push(Scope {
            prefix: prefix.clone(),
            ..Scope::default()
        });
        let mut contents = DirContents {
            locals: Vec::new(),
            outputs: Vec::new(),
            calls: Vec::new(),
        };

        for path in tf {
            let text = read(&path)?;
            let body = parse(&path, &text)?;
            let file = SourceFile::new(path, &text);
            let index = self.files.len();
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
                            let value = Expression::from(default.value.clone())
                                .evaluate(&Context::new())
                                .map_err(|e| e.to_string());
                            self.set_var(scope, name, value, at);
                        }
                    }
                    ("locals", []) => {
                        for attr in block.body.attributes() {
                            contents.locals.push((
                                attr.key.as_str().to_owned(),
                                Expression::from(attr.value.clone()),
                                Location {
                                    file: index,
                                    line: file.line_of_span(attr.span()),
                                },
                            ));
                        }
                    }
                    ("output", [name]) => {
                        if let Some(value) = block.body.get_attribute("value") {
                            contents
                                .outputs
                                .push(((*name).to_owned(), Expression::from(value.value.clone())));
                        }
                    }
                    ("module", [name]) => {
                        let mut call = ModuleCall {
                            name: (*name).to_owned(),
                            source: None,
                            inputs: Vec::new(),
                            at: Location {
                                file: index,
                                line: file.line_of_span(block.span()),
                            },
                        };
                        for attr in block.body.attributes() {
                            let expr = Expression::from(attr.value.clone());
                            let at = Location {
                                file: index,
                                line: file.line_of_span(attr.span()),
                            };
                            match attr.key.as_str() {
                                "source" => call.source = Some(expr),
                                // Meta-arguments, not inputs.
                                "version" | "count" | "for_each" | "providers" | "depends_on" => {}
                                key => call.inputs.push((key.to_owned(), expr, at)),
                            }
                        }
                        contents.calls.push(call);
                    }
                    (mode @ ("resource" | "data"), [kind, name]) => {
                        let mode = if mode == "data" { "data." } else { "" };
                        self.scopes[scope].declared.push((
                            mode,
                            (*kind).to_owned(),
                            (*name).to_owned(),
                            block.body.get_attribute("count").is_some(),
                        ));
                        self.resources.push(Resource {
                            mode,
                            kind: (*kind).to_owned(),
                            name: (*name).to_owned(),
                            module: prefix.clone(),
                            scope,
                            at: Location {
                                file: index,
                                line: file.line_of_span(block.span()),
                            },
                            attrs: attrs_of(&block.body, &file),
                            blocks: nested_blocks(&block.body, &file),
                        });
                    }
                    _ => {}
                }
            }
            self.files.push(file);
        }

        match inputs {
            // A child module: its inputs replace the defaults, as Terraform does.
            Some(inputs) => {
                for (name, value, at) in inputs {
                    self.set_var(scope, &name, value, at);
                }
            }
            // The root module: the variables files Terraform loads, then the ones given.
            None => {
                let tfvars = dir.join("terraform.tfvars");
                let tfvars = tfvars.is_file().then_some(tfvars);
                for path in tfvars
                    .into_iter()
                    .chain(auto_tfvars)
                    .chain(var_files.iter().cloned())
                {
                    self.load_tfvars(scope, &path)?;
                }
            }
        }

        // Locals may use variables, resources, module outputs and other locals: evaluate until no more
        // can be resolved, load the module calls whose inputs are then known, and evaluate again.
        let mut pending = contents.locals;
        self.eval_locals(scope, &mut pending);
        for call in contents.calls {
            self.load_call(dir, scope, call, depth)?;
            self.eval_locals(scope, &mut pending);
        }
        Ok((scope, contents.outputs))
    }

    fn load_tfvars(&mut self, scope: usize, path: &Path) -> Result<(), CheckError> {
        let text = read(path)?;
        let body = parse(path, &text)?;
        let file = SourceFile::new(path.to_path_buf(), &text);
        let index = self.files.len();
        for attr in body.attributes() {
            let at = Location {
                file: index,
                line: file.line_of_span(attr.span()),
            };
            let value = Expression::from(attr.value.clone())
                .evaluate(&Context::new())
                .map_err(|e| e.to_string());
            self.set_var(scope, attr.key.as_str(), value, at);
        }
        self.files.push(file);
        Ok(())
    }

    fn eval_locals(&mut self, scope: usize, pending: &mut Vec<(String, Expression, Location)>) {
        loop {
            let ctx = self.context(scope);
            let before = pending.len();
            let mut still = Vec::new();
            for (name, expr, at) in pending.drain(..) {
                match expr.evaluate(&ctx) {
                    Ok(value) => {
                        self.scopes[scope].locals.insert(name.clone(), value);
                        self.scopes[scope].local_origins.insert(name, at);
                    }
                    Err(_) => still.push((name, expr, at)),
                }
            }
            *pending = still;
            if pending.is_empty() || pending.len() == before {
                break;
            }
        }
    }

    /// Loads a module call with a local source, and makes its outputs visible as `module.NAME.OUTPUT`.
    fn load_call(
        &mut self,
        dir: &Path,
        scope: usize,
        call: ModuleCall,
        depth: usize,
    ) -> Result<(), CheckError> {
        let ctx = self.context(scope);
        let source = call
            .source
            .as_ref()
            .and_then(|s| s.evaluate(&ctx).ok())
            .and_then(|v| v.as_str().map(str::to_owned));
        let file = self.files[call.at.file].name();
        let Some(source) = source.filter(|s| s.starts_with("./") || s.starts_with("../")) else {
            self.notes.push(format!(
                "module \"{}\" ({file}:{}): its source {} is not a local path; check-infra reads no registry or remote module (no network): check the plan JSON instead (terraform show -json PLAN), which has the module's resources",
                call.name,
                call.at.line,
                call.source.as_ref().map_or_else(|| "(none)".to_owned(), |s| s.to_string()),
            ));
            return Ok(());
        };
        if depth >= MAX_MODULE_DEPTH {
            self.notes.push(format!(
                "module \"{}\" ({file}:{}): nested deeper than {MAX_MODULE_DEPTH} modules, not read",
                call.name, call.at.line
            ));
            return Ok(());
        }
        let inputs = call
            .inputs
            .iter()
            .map(|(k, e, at)| (k.clone(), e.evaluate(&ctx).map_err(|e| e.to_string()), *at))
            .collect();
        let prefix = format!("{}module.{}.", self.scopes[scope].prefix, call.name);
        let (child, outputs) =
            self.load_dir(&join(dir, &source), prefix, &[], Some(inputs), depth + 1)?;
        // The child's outputs, evaluated in its scope (what cannot be evaluated is left out).
        let child_ctx = self.context(child);
        let values: hcl::Map<String, Value> = outputs
            .into_iter()
            .filter_map(|(name, expr)| expr.evaluate(&child_ctx).ok().map(|v| (name, v)))
            .collect();
        self.scopes[scope]
            .modules
            .insert(call.name, Value::Object(values));
        Ok(())
    }

    /// Sets a variable's value from a default, a `.tfvars` file or a module input. A value that does not
    /// evaluate makes the variable unknown.
    fn set_var(&mut self, scope: usize, name: &str, value: Result<Value, String>, at: Location) {
        let scope = &mut self.scopes[scope];
        match value {
            Ok(value) => {
                scope.vars.insert(name.to_owned(), value);
            }
            Err(_) => {
                scope.vars.shift_remove(name);
            }
        }
        scope.var_origins.insert(name.to_owned(), at);
    }

    /// Adds a scope holding known values (a plan's module instance); returns its index.
    pub(crate) fn add_scope(&mut self, prefix: String) -> usize {
        self.scopes.push(Scope {
            prefix,
            ..Scope::default()
        });
        self.scopes.len() - 1
    }

    /// Registers a resource read from a plan in its scope.
    pub(crate) fn add_resource(&mut self, resource: Resource) {
        self.scopes[resource.scope].declared.push((
            resource.mode,
            resource.kind.clone(),
            resource.name.clone(),
            false,
        ));
        self.resources.push(resource);
    }

    fn context(&self, scope: usize) -> Context<'static> {
        let s = &self.scopes[scope];
        let mut ctx = Context::new();
        ctx.declare_var("var", Value::Object(s.vars.clone()));
        ctx.declare_var("local", Value::Object(s.locals.clone()));
        ctx.declare_var("module", Value::Object(s.modules.clone()));
        let mut managed: BTreeMap<&str, hcl::Map<String, Value>> = BTreeMap::new();
        let mut data: hcl::Map<String, Value> = hcl::Map::new();
        for (mode, kind, name, counted) in &s.declared {
            let attrs: hcl::Map<String, Value> = REF_ATTRS
                .into_iter()
                .map(|a| {
                    (
                        a.to_owned(),
                        Value::String(placeholder(&format!("{}{mode}{kind}.{name}", s.prefix), a)),
                    )
                })
                .collect();
            // With `count`, `KIND.NAME[0].arn`: one instance is read, all its instances stand for it.
            let value = if *counted {
                Value::Array(vec![Value::Object(attrs)])
            } else {
                Value::Object(attrs)
            };
            if mode.is_empty() {
                managed.entry(kind).or_default().insert(name.clone(), value);
            } else {
                let entry = data
                    .entry(kind.clone())
                    .or_insert_with(|| Value::Object(hcl::Map::new()));
                if let Value::Object(map) = entry {
                    map.insert(name.clone(), value);
                }
            }
        }
        for (kind, names) in managed {
            ctx.declare_var(kind.to_owned(), Value::Object(names));
        }
        ctx.declare_var("data", Value::Object(data));
        ctx.declare_func(
            "jsonencode",
            FuncDef::builder().param(ParamType::Any).build(jsonencode),
        );
        ctx
    }

    /// Evaluates a resource's attribute.
    pub(crate) fn resolve(&self, resource: &Resource, key: &str) -> Resolved {
        self.resolve_attr(resource.scope, resource.attrs.get(key))
    }

    /// Evaluates an attribute (of a resource or a nested block) in `scope`.
    pub(crate) fn resolve_attr(&self, scope: usize, attr: Option<&Attr>) -> Resolved {
        let Some(attr) = attr else {
            return Resolved::Missing;
        };
        match &attr.value {
            AttrValue::Unknown { references } => Resolved::Unknown {
                line: attr.line,
                why: format!(
                    "known only after apply; it depends on {}",
                    if references.is_empty() {
                        "values the plan does not show".to_owned()
                    } else {
                        references.join(", ")
                    }
                ),
                references: references.clone(),
            },
            AttrValue::Expr(expr) => match expr.evaluate(&self.context(scope)) {
                Ok(value) => Resolved::Known {
                    value,
                    line: attr.line,
                    origin: self.origin(scope, expr),
                },
                Err(e) => Resolved::Unknown {
                    line: attr.line,
                    why: e.to_string().lines().next().unwrap_or_default().to_owned(),
                    references: Vec::new(),
                },
            },
        }
    }

    /// ` (var.x, set at variables.tf:12)` when the expression is exactly a
    /// variable or a local; empty otherwise.
    fn origin(&self, scope: usize, expr: &Expression) -> String {
        let Expression::Traversal(traversal) = expr else {
            return String::new();
        };
        let (Expression::Variable(root), [TraversalOperator::GetAttr(name)]) =
            (&traversal.expr, traversal.operators.as_slice())
        else {
            return String::new();
        };
        let s = &self.scopes[scope];
        let origins = match root.as_str() {
            "var" => &s.var_origins,
            "local" => &s.local_origins,
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

/// `dir` joined with a relative module source, without `.` and with `..` applied where it can be.
fn join(dir: &Path, source: &str) -> PathBuf {
    use std::path::Component;
    let mut out = dir.to_path_buf();
    for part in Path::new(source).components() {
        match part {
            Component::CurDir => {}
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            other => out.push(other.as_os_str()),
        }
    }
    out
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
