//! `docs/deploy.md` maps every output of the Terraform samples to the setting it feeds. This test ties the
//! walkthrough to the samples and to the settings the workers read: an output renamed or added in
//! `infra/*/outputs.tf`, a variable renamed in `variables.tf`, or a settings key renamed in
//! `txinbox::settings` breaks the build here, not a user's deployment.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use txinbox::settings::WorkerSettings;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The names declared as `KIND "name"` in the `.tf` files of `dir`.
fn declared(dir: &str, kind: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for e in std::fs::read_dir(root().join(dir)).unwrap().flatten() {
        if e.path().extension().is_none_or(|x| x != "tf") {
            continue;
        }
        for line in std::fs::read_to_string(e.path()).unwrap().lines() {
            let line = line.trim_start();
            if let Some(rest) = line
                .strip_prefix(kind)
                .and_then(|r| r.trim_start().strip_prefix('"'))
            {
                if let Some(name) = rest.split('"').next() {
                    out.insert(name.to_owned());
                }
            }
        }
    }
    out
}

/// The rows of the first Markdown table after `heading` (within `section`) whose header starts with `| first |`:
/// each row's cells, trimmed.
fn table(doc: &str, section: &str, first: &str) -> Vec<Vec<String>> {
    let start = doc
        .find(section)
        .unwrap_or_else(|| panic!("docs/deploy.md has no section {section}"));
    let rest = &doc[start..];
    let header = format!("| {first} |");
    let at = rest
        .find(&header)
        .unwrap_or_else(|| panic!("no table starting `{header}` in {section}"));
    rest[at..]
        .lines()
        .skip(2) // header and separator
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// The text inside the first pair of backticks of `cell`.
fn code(cell: &str) -> Option<&str> {
    let a = cell.find('`')?;
    let b = cell[a + 1..].find('`')?;
    Some(&cell[a + 1..a + 1 + b])
}

/// Whether `[section] key` is a key the settings file accepts.
fn is_setting(setting: &str) -> bool {
    let Some((section, key)) = setting.strip_prefix('[').and_then(|s| s.split_once("] ")) else {
        return false;
    };
    ["\"x\"", "1", "true"].iter().any(|v| {
        match WorkerSettings::from_toml_str(&format!("[{section}]\n{key} = {v}\n")) {
            Ok(_) => true,
            // A value of the wrong type for a known key (or one the settings refuse) still names a real key.
            Err(e) => !e.to_string().contains("unknown field"),
        }
    })
}

fn check_cloud(section: &str, sample: &str) {
    let doc = read("docs/deploy.md");

    let outputs = table(&doc, section, "output");
    let documented: BTreeSet<String> = outputs
        .iter()
        .map(|r| code(&r[0]).expect("an output name in backticks").to_owned())
        .collect();
    assert_eq!(
        documented,
        declared(sample, "output"),
        "docs/deploy.md {section} must list every output of {sample}/outputs.tf, and only those"
    );
    for row in &outputs {
        if let Some(setting) = code(&row[1]) {
            assert!(
                is_setting(setting),
                "{section}: `{setting}` is not a settings key"
            );
        } else {
            assert_eq!(
                row[1], "—",
                "{section}: an output feeds a setting or says —: {row:?}"
            );
        }
    }

    let variables = table(&doc, section, "variable");
    let declared_vars = declared(sample, "variable");
    assert!(!variables.is_empty());
    for row in &variables {
        let v = code(&row[0]).expect("a variable name in backticks");
        assert!(
            declared_vars.contains(v),
            "{section}: no variable `{v}` in {sample}"
        );
        if let Some(setting) = code(&row[1]).filter(|s| s.starts_with('[')) {
            assert!(
                is_setting(setting),
                "{section}: `{setting}` is not a settings key"
            );
        }
    }
}

#[test]
fn the_aws_walkthrough_maps_every_output_to_a_setting() {
    check_cloud("## AWS: SQS FIFO", "infra/aws-sqs-fifo");
}

#[test]
fn the_azure_walkthrough_maps_every_output_to_a_setting() {
    check_cloud("## Azure: Service Bus", "infra/azure-servicebus");
}

#[test]
fn every_settings_file_in_the_walkthrough_loads_and_passes_check_infra_on_its_sample() {
    let doc = read("docs/deploy.md");
    let samples = ["infra/aws-sqs-fifo", "infra/azure-servicebus"];
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .map(|b| b.split("```").next().unwrap())
        .collect();
    assert_eq!(
        blocks.len(),
        samples.len(),
        "one settings file per cloud, in this order"
    );
    for (toml, sample) in blocks.into_iter().zip(samples) {
        let settings = WorkerSettings::from_toml_str(toml).unwrap_or_else(|e| {
            panic!("a settings file in docs/deploy.md does not load: {e}\n{toml}")
        });
        let report = txinbox_infra::check_dir(&root().join(sample), &settings).unwrap();
        assert!(
            report.is_clean(),
            "the walkthrough's settings for {sample} fail check-infra: {report:?}"
        );
    }
}
