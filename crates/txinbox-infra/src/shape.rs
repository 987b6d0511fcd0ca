//! A linear pre-check of a Terraform file's brackets, before the HCL parser sees it.
//!
//! The parser (hcl-rs) backtracks exponentially on some invalid input: a 203-byte file with 25 unclosed `{`
//! (found by fuzzing) kept `check-infra` busy for minutes, and each unclosed level roughly triples the time.
//! A Terraform file is input the checker does not control (a pull request's), so a file whose brackets do not
//! balance, or nest deeper than [`MAX_DEPTH`], is refused here in one pass. Balanced files, however deep, parse
//! fast. Brackets inside strings, comments and heredocs do not count.

/// Deeper nesting than any real module writes (the samples and the community modules stay under 10).
pub(crate) const MAX_DEPTH: usize = 64;

/// Why a file's brackets are refused, with the 1-based line of the offending bracket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShapeError {
    pub(crate) line: usize,
    pub(crate) detail: String,
}

/// Checks that `(`, `[` and `{` outside strings, comments and heredocs are closed in order and nest at most
/// [`MAX_DEPTH`] deep.
pub(crate) fn check(text: &str) -> Result<(), ShapeError> {
    let mut open: Vec<(char, usize)> = Vec::new();
    let mut lines = text.split_inclusive('\n').enumerate().peekable();
    let mut in_block_comment = false;
    while let Some((i, line)) = lines.next() {
        let line_no = i + 1;
        let chars: Vec<char> = line.chars().collect();
        let mut j = 0;
        let mut in_string = false;
        while j < chars.len() {
            let c = chars[j];
            if in_block_comment {
                if c == '*' && chars.get(j + 1) == Some(&'/') {
                    in_block_comment = false;
                    j += 1;
                }
            } else if in_string {
                match c {
                    '\\' => j += 1,
                    '"' => in_string = false,
                    _ => {}
                }
            } else {
                match c {
                    '"' => in_string = true,
                    '#' => break,
                    '/' if chars.get(j + 1) == Some(&'/') => break,
                    '/' if chars.get(j + 1) == Some(&'*') => {
                        in_block_comment = true;
                        j += 1;
                    }
                    '<' if chars.get(j + 1) == Some(&'<') => {
                        // A heredoc: `<<ID` or `<<-ID`, then lines up to one that is ID alone.
                        let rest: String = chars[j + 2..].iter().collect();
                        let id: String = rest
                            .trim_start_matches('-')
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        if !id.is_empty() {
                            let mut closed = false;
                            for (_, l) in lines.by_ref() {
                                if l.trim() == id {
                                    closed = true;
                                    break;
                                }
                            }
                            if !closed {
                                return Err(ShapeError {
                                    line: line_no,
                                    detail: format!("the heredoc <<{id} is never closed"),
                                });
                            }
                            break;
                        }
                        j += 1;
                    }
                    '(' | '[' | '{' => {
                        open.push((c, line_no));
                        if open.len() > MAX_DEPTH {
                            return Err(ShapeError {
                                line: line_no,
                                detail: format!("brackets nest deeper than {MAX_DEPTH}"),
                            });
                        }
                    }
                    ')' | ']' | '}' => {
                        let want = match c {
                            ')' => '(',
                            ']' => '[',
                            _ => '{',
                        };
                        match open.pop() {
                            Some((o, _)) if o == want => {}
                            Some((o, at)) => {
                                return Err(ShapeError {
                                    line: line_no,
                                    detail: format!("`{c}` closes the `{o}` opened at line {at}"),
                                })
                            }
                            None => {
                                return Err(ShapeError {
                                    line: line_no,
                                    detail: format!("`{c}` closes nothing"),
                                })
                            }
                        }
                    }
                    _ => {}
                }
            }
            j += 1;
        }
    }
    match open.last() {
        Some((o, at)) => Err(ShapeError {
            line: *at,
            detail: format!("`{o}` is never closed"),
        }),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_terraform_passes() {
        let tf = r#"
resource "aws_sqs_queue" "main" {
  name = "${var.name}.fifo" # a comment with { and (
  redrive_policy = jsonencode({ deadLetterTargetArn = aws_sqs_queue.dlq.arn, maxReceiveCount = 5 })
  tags = merge(var.tags, { "a" = "}" }) // another } comment
  /* a block comment { [ ( */
  policy = <<-EOF
    { "Statement": [ { "Effect": "Allow" "unbalanced { in a heredoc
  EOF
  list = [for s in var.x : "${lookup(var.m, "k")}-${s}"]
}
"#;
        assert_eq!(check(tf), Ok(()));
    }

    #[test]
    fn unbalanced_or_too_deep_files_are_refused_with_the_line() {
        assert_eq!(
            check("a = {\n b = [1, 2\n}\n").unwrap_err(),
            ShapeError {
                line: 3,
                detail: "`}` closes the `[` opened at line 2".into()
            }
        );
        assert_eq!(check("a = 1\n}\n").unwrap_err().line, 2);
        assert_eq!(check("a = {\n").unwrap_err().detail, "`{` is never closed");
        assert!(check("x = <<EOT\nnever closed\n").is_err());
        let deep = format!(
            "a = {}1{}",
            "[".repeat(MAX_DEPTH + 1),
            "]".repeat(MAX_DEPTH + 1)
        );
        assert!(check(&deep).unwrap_err().detail.contains("deeper"));
        let ok = format!("a = {}1{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert_eq!(check(&ok), Ok(()));
    }
}
