//! The guides say what the vendors say, and keep saying it: each check below fails when a sentence a user relies
//! on is edited away, when the Terraform sample and the guide disagree on a figure, or when a guide points at
//! something outside this repository.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Every Markdown file of the repository (not the build output, not dependencies).
fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            if p.is_dir() {
                if !name.starts_with('.') && name != "target" && name != "node_modules" {
                    walk(&p, out);
                }
            } else if name.ends_with(".md") {
                out.push(p);
            }
        }
    }
    let mut out = Vec::new();
    walk(&root(), &mut out);
    assert!(out.len() > 5, "found the guides: {out:?}");
    out
}

/// Text with line breaks and the Markdown quote/indent runs folded to single spaces, so that a sentence
/// wrapped over lines still matches.
fn folded(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[test]
fn no_guide_points_outside_the_repository() {
    for p in markdown_files() {
        let text = std::fs::read_to_string(&p).unwrap();
        for bad in ["shared/docs", "§", "../shared"] {
            assert!(
                !text.contains(bad),
                "{} mentions `{bad}`: the repository stands alone",
                p.display()
            );
        }
    }
}

#[test]
fn service_bus_duplicate_detection_tiers_creation_and_window() {
    let guide = folded(&read("docs/servicebus.md"));
    for sentence in [
        "The basic tier of Service Bus doesn't support duplicate detection. The standard and premium tiers support duplicate detection.",
        "You can't enable or disable duplicate detection after the queue or topic is created. You can only do so at the time of creating the queue or topic.",
        "the message is reported as accepted (the send operation succeeds), but the newly sent message is instantly ignored and dropped",
    ] {
        assert!(guide.contains(sentence), "docs/servicebus.md must quote: {sentence}");
    }
    // The window the guide states is the one the sample sets.
    assert!(guide.contains("sets it to **PT10M** (10 minutes"));
    let sample: String = std::fs::read_dir(root().join("infra/azure-servicebus"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "tf"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect();
    assert!(
        sample.contains("duplicate_detection_history_time_window") && sample.contains("\"PT10M\""),
        "infra/azure-servicebus sets the duplicate detection window to PT10M, as docs/servicebus.md says"
    );
    assert!(
        sample.contains("requires_duplicate_detection"),
        "the sample turns duplicate detection on (only possible at creation)"
    );
}

#[test]
fn sqs_fifo_window_and_dead_letter_move_say_what_aws_says() {
    let guide = folded(&read("docs/sqs.md"));
    for sentence in [
        // The DLQ move replaces the deduplication id.
        "when a message is moved from a FIFO queue to a FIFO DLQ, the original message's deduplication ID will be replaced with the original message's ID",
        // A send dropped by the window still succeeds.
        "if a message with a particular MessageDeduplicationId is sent successfully, any messages sent with the same MessageDeduplicationId are accepted successfully but aren't delivered during the 5-minute deduplication interval",
        // High-throughput scope.
        "deduplication occurs at the message group level",
        "`SqsOptions::deduplication_id_identity(true)`",
    ] {
        assert!(guide.contains(sentence), "docs/sqs.md must say: {sentence}");
    }
}
