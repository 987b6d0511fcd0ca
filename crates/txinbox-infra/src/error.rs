//! Typed errors of the checker.

use std::path::PathBuf;

/// Why a directory could not be checked at all.
///
/// A violation of a rule is not an error: it is reported in the
/// [`Report`](crate::Report). An error means the check could not be done
/// (a file could not be read, HCL did not parse, the configuration is wrong).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckError {
    /// A file or directory could not be read.
    #[error("cannot read {}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A Terraform (`.tf`) or variables (`.tfvars`) file is not valid HCL.
    #[error("{} is not valid HCL", file.display())]
    Parse {
        /// The file that failed to parse.
        file: PathBuf,
        /// The parser's error, with line and column.
        #[source]
        source: HclError,
    },
    /// A Terraform (`.tf`) or variables (`.tfvars`) file whose brackets do not balance or nest too deep:
    /// refused before parsing, in linear time.
    #[error("{}:{line} is not valid HCL: {detail}", file.display())]
    Shape {
        /// The file.
        file: PathBuf,
        /// The line of the offending bracket.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// A plan JSON file is not the output of `terraform show -json PLAN`.
    #[error("{} is not a Terraform plan in JSON: {detail}", file.display())]
    Plan {
        /// The file.
        file: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// The worker settings file (`--config`) cannot be read or is not valid.
    #[error("invalid worker settings in {}", path.display())]
    Config {
        /// The settings file.
        path: PathBuf,
        /// Why, naming the key (or the environment variable).
        #[source]
        source: Box<txinbox_core::settings::SettingsError>,
    },
    /// The directory holds no `*.tf` file.
    #[error("no Terraform (*.tf) files in {}", dir.display())]
    NoTerraformFiles {
        /// The directory that was checked.
        dir: PathBuf,
    },
    /// The directory's Terraform (or the plan) declares no queue or table this checker knows
    /// (`aws_sqs_queue`, `azurerm_servicebus_queue`, `aws_dynamodb_table`): most likely the wrong
    /// directory was given.
    #[error(
        "no aws_sqs_queue, azurerm_servicebus_queue or aws_dynamodb_table resource in {}",
        dir.display()
    )]
    NoQueues {
        /// The directory that was checked.
        dir: PathBuf,
    },
    /// Writing the report failed.
    #[error("cannot write the report")]
    Output(#[source] std::io::Error),
}

/// Where and why a file is not valid HCL, as the parser says it, without the text of the line it stops at: a
/// variables file holds secrets (`db_password = "..."`), and the parser's own error quotes that line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("HCL parse error in line {line}, column {column}: {message}")]
#[non_exhaustive]
pub struct HclError {
    /// The line (from 1).
    pub line: usize,
    /// The column (from 1).
    pub column: usize,
    /// What the parser expected (`expected newline or eof`).
    pub message: String,
}

impl From<hcl::edit::parser::Error> for HclError {
    fn from(e: hcl::edit::parser::Error) -> Self {
        Self {
            line: e.location().line(),
            column: e.location().column(),
            message: e.message().to_owned(),
        }
    }
}
