use super::{SettingsError, TomlError, WorkerSettings, ENV_PREFIX};

impl WorkerSettings {
    pub(super) fn parse(
        text: &str,
        origin: String,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Self, SettingsError> {
        let mut table: toml::Table = toml::from_str(text).map_err(|e| SettingsError::Invalid {
            origin: origin.clone(),
            source: TomlError::new(&e),
        })?;
        let mut applied = Vec::new();
        let mut overrides: Vec<(String, String)> = env
            .into_iter()
            .filter(|(k, _)| k.len() > ENV_PREFIX.len() && k.starts_with(ENV_PREFIX))
            .collect();
        overrides.sort();
        for (var, value) in overrides {
            let rest = &var[ENV_PREFIX.len()..];
            let Some((section, key)) = rest.split_once("__") else {
                // Other TXINBOX_ variables (TXINBOX_CRM_URL, ...) are not settings.
                continue;
            };
            let (section, key) = (section.to_ascii_lowercase(), key.to_ascii_lowercase());
            if !["worker", "store", "inbox", "sqs", "servicebus", "effects"]
                .contains(&section.as_str())
            {
                return Err(SettingsError::Override {
                    var,
                    detail: format!(
                        "no section [{section}] (worker, store, inbox, sqs, servicebus, effects)"
                    ),
                });
            }
            if key.is_empty() {
                return Err(SettingsError::Override {
                    var,
                    detail: "no key after `__`".into(),
                });
            }
            let entry = table
                .entry(section.clone())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            let toml::Value::Table(t) = entry else {
                return Err(SettingsError::Override {
                    var,
                    detail: format!("[{section}] is not a table in the file"),
                });
            };
            t.insert(key.clone(), scalar(&value));
            applied.push((var, value, format!("{section}.{key}")));
        }
        let origin = if applied.is_empty() {
            origin
        } else {
            let names: Vec<&str> = applied.iter().map(|(v, _, _)| v.as_str()).collect();
            format!("{origin} with {}", names.join(", "))
        };
        // An override that reads as a number or a boolean is still a string where its key takes one (a
        // consumer or a queue named with digits): the key the error names is given its text instead.
        let mut as_text = Vec::new();
        let typed = loop {
            let source = match table.clone().try_into::<Self>() {
                Ok(s) => break Ok(s),
                Err(source) => source,
            };
            let msg = source.to_string();
            let retry = applied.iter().find(|(_, value, path)| {
                !matches!(scalar(value), toml::Value::String(_))
                    && !as_text.contains(path)
                    && msg.contains(&format!("in `{path}`"))
                    && msg.contains("expected a string")
            });
            let Some((_, value, path)) = retry else {
                break Err(source);
            };
            let (section, key) = path.split_once('.').unwrap_or_default();
            if let Some(toml::Value::Table(t)) = table.get_mut(section) {
                t.insert(key.to_owned(), toml::Value::String(value.clone()));
            }
            as_text.push(path.clone());
        };
        let s: Self = typed.map_err(|source: toml::de::Error| {
            // A TOML type error quotes the value; an override's value may be a password, so such an error is
            // reported without it, naming the variable instead.
            let msg = source.to_string();
            match applied
                .iter()
                .find(|(_, value, _)| !value.is_empty() && msg.contains(value.as_str()))
            {
                Some((var, value, _)) => SettingsError::Override {
                    var: var.clone(),
                    detail: msg.replace(value.as_str(), "<redacted>").trim().to_owned(),
                },
                None => SettingsError::Invalid {
                    origin: origin.clone(),
                    source: TomlError::new(&source),
                },
            }
        })?;
        s.validate(&origin)?;
        Ok(s)
    }
}

/// An override's value as TOML: an integer or a boolean when it parses as one, else a string.
fn scalar(v: &str) -> toml::Value {
    if let Ok(i) = v.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = v.parse::<bool>() {
        toml::Value::Boolean(b)
    } else {
        toml::Value::String(v.to_owned())
    }
}
