//! Every `cargo run` command in the repository's Markdown (README.md, docs/, infra/, examples/, crates/)
//! names a package of the workspace and a binary it has: `cargo run -p txinbox -- check-infra` (there is no
//! package `txinbox` with a binary) cannot come back.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Package name -> its binaries, from `cargo metadata`.
fn workspace_bins() -> BTreeMap<String, Vec<String>> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = std::process::Command::new(cargo)
        .args([
            "metadata",
            "--no-deps",
            "--format-version",
            "1",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("run cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    meta["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let bins = p["targets"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
                .map(|t| t["name"].as_str().unwrap().to_owned())
                .collect();
            (p["name"].as_str().unwrap().to_owned(), bins)
        })
        .collect()
}

fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(name.as_str(), "target" | "node_modules") && !name.starts_with('.') {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The `cargo run` invocations in `text`, as (line, arguments before `--`).
fn cargo_runs(text: &str) -> Vec<(usize, Vec<String>)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(at) = rest.find("cargo run") {
            rest = &rest[at + "cargo run".len()..];
            let args: Vec<String> = rest
                .split(['`', '|', ';', ')', '&'])
                .next()
                .unwrap_or("")
                .split_whitespace()
                .take_while(|a| *a != "--" && !a.starts_with('#'))
                .map(str::to_owned)
                .collect();
            out.push((i + 1, args));
        }
    }
    out
}

/// What is wrong with one invocation, if anything.
fn problem(args: &[String], bins: &BTreeMap<String, Vec<String>>) -> Option<String> {
    let value = |flags: &[&str]| {
        args.iter().enumerate().find_map(|(i, a)| {
            flags.iter().find_map(|f| {
                a.strip_prefix(&format!("{f}="))
                    .map(str::to_owned)
                    .or_else(|| (a == f).then(|| args.get(i + 1).cloned()).flatten())
            })
        })
    };
    if args
        .iter()
        .any(|a| a == "--example" || a.starts_with("--example="))
    {
        return None;
    }
    let package = value(&["-p", "--package"]);
    let bin = value(&["--bin"]);
    match (package, bin) {
        (Some(p), bin) => {
            let Some(have) = bins.get(&p) else {
                return Some(format!("no package {p:?} in the workspace"));
            };
            match bin {
                Some(b) if !have.contains(&b) => Some(format!(
                    "package {p:?} has no binary {b:?} (it has {have:?})"
                )),
                Some(_) => None,
                None if have.len() == 1 => None,
                None => Some(format!(
                    "package {p:?} has {} binaries ({have:?}): name one with --bin",
                    have.len()
                )),
            }
        }
        (None, Some(b)) => (!bins.values().any(|v| v.contains(&b)))
            .then(|| format!("no binary {b:?} in the workspace")),
        (None, None) => Some(
            "the workspace root is a virtual manifest: name the package with -p (and --bin)".into(),
        ),
    }
}

#[test]
fn every_cargo_run_in_the_docs_names_a_real_package_and_binary() {
    let bins = workspace_bins();
    assert!(
        bins.get("txinbox-cli")
            .is_some_and(|b| b.contains(&"txinbox".to_owned())),
        "{bins:?}"
    );
    let mut files = Vec::new();
    markdown_files(&root(), &mut files);
    files.sort();
    let mut seen = 0;
    let mut problems = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for (line, args) in cargo_runs(&text) {
            seen += 1;
            if let Some(p) = problem(&args, &bins) {
                problems.push(format!(
                    "{}:{line}: cargo run {}: {p}",
                    file.strip_prefix(root()).unwrap_or(file).display(),
                    args.join(" ")
                ));
            }
        }
    }
    assert!(
        seen >= 10,
        "only {seen} cargo run commands found in {} files",
        files.len()
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn the_checker_catches_the_broken_command() {
    let bins = workspace_bins();
    let runs = cargo_runs(
        "```sh\ncargo run -p txinbox -- check-infra infra/aws-sqs-fifo\n```\n\
         and `cargo run -p txinbox-cli --bin txinbox -- check-infra DIR`, \
         `cargo run -p txinbox-cli --bin nope`, `cargo run --package=sqs-producer -- --times 2`",
    );
    let found: Vec<Option<String>> = runs.iter().map(|(_, a)| problem(a, &bins)).collect();
    assert_eq!(runs.len(), 4, "{runs:?}");
    assert!(
        found[0]
            .as_deref()
            .is_some_and(|p| p.contains("no package \"txinbox\"") || p.contains("binaries")),
        "{found:?}"
    );
    assert_eq!(found[1], None);
    assert!(found[2]
        .as_deref()
        .is_some_and(|p| p.contains("no binary \"nope\"")));
    assert_eq!(found[3], None);
}
