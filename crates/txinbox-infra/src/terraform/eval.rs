//! Evaluating attributes in a module instance's scope: variables, locals, module outputs, placeholders.

use std::collections::BTreeMap;

use hcl::eval::{Context, Evaluate, FuncArgs, FuncDef, ParamType};
use hcl::expr::{Expression, TraversalOperator};
use hcl::Value;

use super::{placeholder, Attr, AttrValue, Module, Resolved, Resource, REF_ATTRS};

/// `jsonencode(value)`.
fn jsonencode(args: FuncArgs) -> Result<Value, String> {
    let value = args.into_values().into_iter().next().unwrap_or(Value::Null);
    serde_json::to_string(&value)
        .map(Value::String)
        .map_err(|e| e.to_string())
}

impl Module {
    pub(super) fn context(&self, scope: usize) -> Context<'static> {
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
                // Terraform: "If you set an argument of a resource or module to null, Terraform behaves as
                // though you had completely omitted it — it will use the argument's default value if it has
                // one" (as a plan shows it: without the attribute).
                Ok(Value::Null) => Resolved::Missing,
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
