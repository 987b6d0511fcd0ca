//! Reading a Terraform directory into a [`Module`]: its `*.tf` files, variables files and local modules.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use hcl::edit::structure::{Block, Body, Structure};
use hcl::edit::Span;
use hcl::eval::{Context, Evaluate};
use hcl::expr::Expression;
use hcl::Value;

use super::{Attr, AttrValue, Location, Module, NestedBlock, Resource, Scope, SourceFile};
use crate::CheckError;

/// How deep local modules may nest.
const MAX_MODULE_DEPTH: usize = 8;

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
        source: source.into(),
    })
}

fn labels(block: &Block) -> Vec<&str> {
    block.labels.iter().map(|l| l.as_str()).collect()
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

/// The kinds of the blocks in `body` (a `dynamic "condition"` counts as a `condition`).
fn children_of(body: &Body) -> Vec<String> {
    body.blocks()
        .map(|b| match (b.ident.as_str(), labels(b).as_slice()) {
            ("dynamic", [ident]) => (*ident).to_owned(),
            (ident, _) => ident.to_owned(),
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
                        children: children_of(&content.body),
                        dynamic: true,
                        for_each: attrs_of(&block.body, file).remove("for_each"),
                        line: file.line_of_span(block.span()),
                    });
                }
            }
            (ident, _) => out.push(NestedBlock {
                ident: ident.to_owned(),
                attrs: attrs_of(&block.body, file),
                children: children_of(&block.body),
                dynamic: false,
                for_each: None,
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
                call.source.as_ref().map_or_else(|| "(none)".to_owned(), |s| redact_source(&s.to_string())),
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
}

/// A module source as it may be printed: without the password of a URL's user info (`ssh://git:***@...`), or
/// over HTTP(S) without its whole user info (`https://***@...`: a token may be the user name), and with the value of every query argument but `ref` and `depth` replaced by `***`. Terraform's module
/// sources carry credentials there: "sshkey: An SSH private key to use during clones", `aws_access_key_secret`
/// for S3, a token in the user info of an HTTPS Git URL.
pub(crate) fn redact_source(source: &str) -> String {
    // As the expression prints: a string literal in its quotes.
    if let Some(inner) = source
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .filter(|s| !s.is_empty())
    {
        return format!("\"{}\"", redact_source(inner));
    }
    let (base, query) = match source.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (source, None),
    };
    let mut out = String::with_capacity(source.len());
    // The user info: between "://" and the first '@' of the authority (before any '/').
    match base.find("://") {
        Some(i) => {
            let after = &base[i + 3..];
            let authority_end = after.find('/').unwrap_or(after.len());
            match after[..authority_end].rfind('@') {
                Some(at) => {
                    out.push_str(&base[..i + 3]);
                    // Over HTTPS the user name is a secret too: GitHub and GitLab take a token there
                    // (`https://TOKEN@github.com/...`, `https://TOKEN:x-oauth-basic@...`). Over SSH it is
                    // `git`, kept.
                    let scheme = base[..i].rsplit([':', '+']).next().unwrap_or_default();
                    if scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http") {
                        out.push_str("***");
                    } else {
                        out.push_str(after[..at].split(':').next().unwrap_or_default());
                        if after[..at].contains(':') {
                            out.push_str(":***");
                        }
                    }
                    out.push_str(&after[at..]);
                }
                None => out.push_str(base),
            }
        }
        None => out.push_str(base),
    }
    if let Some(query) = query {
        out.push('?');
        let args: Vec<String> = query
            .split('&')
            .map(|arg| match arg.split_once('=') {
                Some((k, v)) if k == "ref" || k == "depth" => format!("{k}={v}"),
                Some((k, _)) => format!("{k}=***"),
                None => arg.to_owned(),
            })
            .collect();
        out.push_str(&args.join("&"));
    }
    out
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
