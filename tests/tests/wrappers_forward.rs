//! Every wrapper of a core trait in the workspace's code forwards the trait's defaulted methods.
//!
//! A wrapper (a store, delivery, processor or executor that holds another and passes its calls on) that leaves a
//! defaulted method to the trait's default answers the default instead of the wrapped value's answer: the lab's
//! faulty store answered no holder for a DynamoDB store that had one, the bench's timed processor no payload
//! limit, the lab's recording executor refused every compensation. The compiler cannot see it, since the default
//! compiles. This test reads the sources: it finds the core's public traits and their defaulted methods, then
//! every `impl Trait for Type` outside test code whose body calls two of the trait's methods on fields of
//! `self` (`self.inner.message()`, `self.inner.lease()`: the mark of a wrapper), and requires each defaulted method to be defined
//! there, or named in a comment of the impl saying it is ``left to the trait's default`` on purpose, and why.
//!
//! It reads text, not Rust's syntax tree: comments and string literals are blanked before braces are counted.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The `.rs` files under `dir`, `target` directories left out.
fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries {
        let path = entry.expect("a directory entry").path();
        if path.is_dir() {
            if path.file_name().is_some_and(|n| n != "target") {
                rust_files(&path, out);
            }
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Test code: a file under a `tests` directory, a `tests.rs` or `*_tests.rs`, or a module after
/// `#[cfg(test)]` (cut off by [`outside_tests`]).
fn is_test_file(path: &Path) -> bool {
    path.components().any(|c| c.as_os_str() == "tests")
        || path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n == "tests.rs" || n.ends_with("_tests.rs"))
}

/// `raw` and its blanked `text` with every inline `#[cfg(test)] mod NAME { .. }` blanked too.
fn without_test_modules(raw: &str, text: &str) -> (String, String) {
    let (mut raw_out, mut text_out) = (raw.as_bytes().to_vec(), text.as_bytes().to_vec());
    for (at, _) in text.match_indices("#[cfg(test)]") {
        let rest = &text[at + "#[cfg(test)]".len()..];
        if !rest.trim_start().starts_with("mod ") {
            continue;
        }
        let Some(open) = rest.find(['{', ';']).map(|o| at + "#[cfg(test)]".len() + o) else {
            continue;
        };
        if text.as_bytes()[open] == b'{' {
            let end = (close_of(text, open) + 1).min(text.len());
            for out in [&mut raw_out, &mut text_out] {
                for c in &mut out[at..end] {
                    if *c != b'\n' {
                        *c = b' ';
                    }
                }
            }
        }
    }
    let keep = |v: Vec<u8>| String::from_utf8_lossy(&v).into_owned();
    (keep(raw_out), keep(text_out))
}

/// `text` with comments, string and character literals blanked (same length, so offsets stay), lifetimes kept.
fn blank(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'/' if b.get(i + 1) == Some(&b'/') => {
                while i < b.len() && b[i] != b'\n' {
                    out[i] = b' ';
                    i += 1;
                }
            }
            b'/' if b.get(i + 1) == Some(&b'*') => {
                while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                    out[i] = b' ';
                    i += 1;
                }
                for _ in 0..2 {
                    if i < b.len() {
                        out[i] = b' ';
                        i += 1;
                    }
                }
            }
            b'r' if b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"') => {
                // A raw string: r"..." or r#"..."#.
                let mut j = i + 1;
                let mut hashes = 0;
                while b.get(j) == Some(&b'#') {
                    hashes += 1;
                    j += 1;
                }
                let ident_before =
                    |k: usize| k > 0 && (b[k - 1].is_ascii_alphanumeric() || b[k - 1] == b'_');
                // `br"..."` is raw too; `for"` or `xr#` are not.
                let prefixed = ident_before(i) && (b[i - 1] != b'b' || ident_before(i - 1));
                if b.get(j) != Some(&b'"') || prefixed {
                    i += 1;
                    continue;
                }
                j += 1;
                let close: Vec<u8> = std::iter::once(b'"')
                    .chain(std::iter::repeat_n(b'#', hashes))
                    .collect();
                while j < b.len() && !b[j..].starts_with(&close) {
                    j += 1;
                }
                let end = (j + close.len()).min(b.len());
                out[i..end].iter_mut().for_each(|c| *c = b' ');
                i = end;
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' {
                    j += if b[j] == b'\\' { 2 } else { 1 };
                }
                let end = (j + 1).min(b.len());
                out[i..end].iter_mut().for_each(|c| *c = b' ');
                i = end;
            }
            b'\'' => {
                // A character literal ('x', '\n', '\u{..}'), not a lifetime ('a).
                let lit = if b.get(i + 1) == Some(&b'\\') {
                    b[i + 3..]
                        .iter()
                        .position(|&c| c == b'\'')
                        .map(|p| i + 3 + p)
                } else if b.get(i + 2) == Some(&b'\'') {
                    Some(i + 2)
                } else {
                    None
                };
                match lit {
                    Some(end) => {
                        out[i..=end].iter_mut().for_each(|c| *c = b' ');
                        i = end + 1;
                    }
                    None => i += 1,
                }
            }
            _ => i += 1,
        }
    }
    String::from_utf8(out)
        .expect("blanking keeps UTF-8: only ASCII bytes are replaced, whole literals at a time")
}

/// The offset of the `}` closing the `{` at `open`.
fn close_of(text: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (i, c) in text[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    text.len()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The identifier starting at `at`.
fn ident_at(text: &str, at: usize) -> &str {
    let end = text[at..]
        .find(|c: char| !is_ident(c))
        .map_or(text.len(), |e| at + e);
    &text[at..end]
}

/// Each `fn NAME` of a trait's or impl's body at its top level, with whether it has a body.
fn methods(body: &str) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(p) = body[i..].find("fn ") {
        let at = i + p;
        if at > 0 && is_ident(body[..at].chars().next_back().unwrap_or(' ')) {
            i = at + 3;
            continue;
        }
        let name = ident_at(body, at + 3).to_owned();
        // The signature ends at the first `;` or `{` outside parentheses, brackets and angle brackets.
        let mut depth = 0i32;
        let mut end = body.len();
        let mut has_body = false;
        for (k, c) in body[at..].char_indices() {
            match c {
                '(' | '[' | '<' => depth += 1,
                ')' | ']' => depth -= 1,
                '>' if !body[..at + k].ends_with('-') => depth -= 1,
                ';' if depth <= 0 => {
                    end = at + k + 1;
                    break;
                }
                '{' if depth <= 0 => {
                    has_body = true;
                    end = close_of(body, at + k) + 1;
                    break;
                }
                _ => {}
            }
        }
        if !name.is_empty() {
            out.push((name, has_body));
        }
        i = end;
    }
    out
}

/// The core's public traits: name to (every method, the defaulted ones).
fn core_traits() -> BTreeMap<String, (BTreeSet<String>, BTreeSet<String>)> {
    let mut files = Vec::new();
    rust_files(&root().join("crates/txinbox-core/src"), &mut files);
    assert!(files.len() > 20, "the core's sources were not found");
    let mut traits = BTreeMap::new();
    for f in files {
        let text = blank(&std::fs::read_to_string(&f).expect("a source file is readable"));
        let mut i = 0;
        while let Some(p) = text[i..].find("pub trait ") {
            let at = i + p + "pub trait ".len();
            let name = ident_at(&text, at).to_owned();
            let Some(open) = text[at..].find('{').map(|o| at + o) else {
                break;
            };
            let close = close_of(&text, open);
            let ms = methods(&text[open + 1..close]);
            let all = ms.iter().map(|(n, _)| n.clone()).collect();
            let defaulted = ms
                .iter()
                .filter(|(_, b)| *b)
                .map(|(n, _)| n.clone())
                .collect();
            traits.insert(name, (all, defaulted));
            i = close;
        }
    }
    traits
}

/// Each wrapper's impl that leaves a defaulted method out (`file:line: impl ..: [methods]`), and how many
/// wrappers were found.
fn unforwarded() -> (Vec<String>, usize) {
    let traits = core_traits();
    for t in [
        "InboxStore",
        "EffectStore",
        "EffectExecutor",
        "Delivery",
        "Processor",
    ] {
        let (_, defaulted) = traits
            .get(t)
            .unwrap_or_else(|| panic!("the core's trait {t} was not found"));
        assert!(
            !defaulted.is_empty(),
            "{t} has no defaulted method: the scan is broken"
        );
    }
    let mut files = Vec::new();
    for dir in ["crates", "examples", "tests"] {
        rust_files(&root().join(dir), &mut files);
    }
    let mut out = Vec::new();
    let mut wrappers = 0;
    for f in files
        .iter()
        .filter(|f| !is_test_file(f.strip_prefix(root()).unwrap_or(f)))
    {
        let raw = std::fs::read_to_string(f).expect("a source file is readable");
        let (raw, text) = without_test_modules(&raw, &blank(&raw));
        let mut i = 0;
        while let Some(p) = text[i..].find("impl") {
            let at = i + p;
            i = at + 4;
            let before = text[..at].chars().next_back().unwrap_or(' ');
            let after = text[at + 4..].chars().next().unwrap_or(' ');
            if is_ident(before) || !(after == '<' || after.is_whitespace()) {
                continue;
            }
            let Some(open) = text[at..].find(['{', ';']).map(|o| at + o) else {
                break;
            };
            if text.as_bytes()[open] == b';' {
                continue;
            }
            let head = text[at..open]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let Some((trait_part, _)) = head.split_once(" for ") else {
                continue;
            };
            // `impl<..> path::Trait<..>`: the trait's name is the last path segment before its generics.
            let trait_part = trait_part.trim_start_matches("impl");
            let trait_part = strip_leading_generics(trait_part.trim());
            let name = trait_part
                .split('<')
                .next()
                .unwrap_or("")
                .rsplit("::")
                .next()
                .unwrap_or("")
                .trim();
            let Some((all, defaulted)) = traits.get(name) else {
                continue;
            };
            let close = close_of(&text, open);
            let body = &text[open + 1..close];
            // Two of the trait's methods called on fields: one alone can be a homonym (the inbox processor's
            // `consumer()` asks its inbox, which is no processor).
            let wraps = all.iter().filter(|m| calls_on_a_field(body, m)).count() >= 2;
            if !wraps || defaulted.is_empty() {
                continue;
            }
            wrappers += 1;
            let defined: BTreeSet<String> = methods(body).into_iter().map(|(n, _)| n).collect();
            let raw_body = raw.get(open + 1..close).unwrap_or("");
            let missing: Vec<String> = defaulted
                .iter()
                .filter(|m| !defined.contains(*m))
                .filter(|m| !raw_body.contains(&format!("`{m}` is left to the trait's default")))
                .cloned()
                .collect();
            if !missing.is_empty() {
                out.push(format!(
                    "{}:{}: {head}: {missing:?}",
                    f.strip_prefix(root()).unwrap_or(f).display(),
                    raw[..at].lines().count() + 1,
                ));
            }
            i = close;
        }
    }
    (out, wrappers)
}

/// `Trait<..>` after `impl<..>`'s own generics are removed.
fn strip_leading_generics(s: &str) -> &str {
    if !s.starts_with('<') {
        return s;
    }
    let mut depth = 0;
    for (i, c) in s.char_indices() {
        match c {
            '<' => depth += 1,
            '>' => {
                depth -= 1;
                if depth == 0 {
                    return s[i + 1..].trim_start();
                }
            }
            _ => {}
        }
    }
    s
}

/// Whether `body` calls `method` on a field of `self` (`self.inner.method(`, `self.0.method(`,
/// `self.inner().method(`).
fn calls_on_a_field(body: &str, method: &str) -> bool {
    let call = format!(".{method}(");
    body.match_indices(&call).any(|(at, _)| {
        let before = body[..at].trim_end_matches("()");
        let field_start = before.rfind(|c: char| !is_ident(c)).map_or(0, |p| p + 1);
        field_start > 0 && before[..field_start].ends_with("self.") && field_start < before.len()
    })
}

#[test]
fn every_wrapper_of_a_core_trait_forwards_its_defaulted_methods() {
    let (missing, wrappers) = unforwarded();
    // The scan must see the wrappers it exists for (the lab's faulty store and delivery, the boxed delivery, the
    // worker's leased delivery, the bench's timed processor, the lab's recording executor).
    assert!(
        wrappers >= 6,
        "only {wrappers} wrappers found: the scan is broken"
    );
    assert!(
        missing.is_empty(),
        "wrappers that leave defaulted methods to the trait's default (forward each, or say in the impl that \
         `NAME` is left to the trait's default on purpose, and why):\n{}",
        missing.join("\n")
    );
}

// The scan itself: a wrapper that leaves a defaulted method out is found; one that says why is not; an
// implementation that wraps nothing is not a wrapper.
#[test]
fn the_scan_finds_a_wrapper_without_a_forward() {
    let body = blank(
        "fn message(&self) -> &M { self.inner.message() }\n\
         fn lease(&self) -> Option<L> { None }\n\
         // `x` is left to the trait's default on purpose\n\
         fn ack(self) -> impl Future<Output = ()> + Send { async {} }",
    );
    assert!(calls_on_a_field(&body, "message"));
    assert!(!calls_on_a_field(&body, "lease"));
    assert!(calls_on_a_field("let m = self.0.message();", "message"));
    assert!(calls_on_a_field("self.inner().message()", "message"));
    assert!(!calls_on_a_field("message.message()", "message"));
    let names = methods(&body);
    assert_eq!(
        names,
        [
            ("message".to_owned(), true),
            ("lease".to_owned(), true),
            ("ack".to_owned(), true)
        ]
    );
    let traits = core_traits();
    let (_, delivery) = &traits["Delivery"];
    assert!(delivery.contains("release_holds"), "{delivery:?}");
    assert_eq!(
        blank("let s = \"{ }\"; // }\n'{'"),
        "let s =      ;     \n   "
    );
}
