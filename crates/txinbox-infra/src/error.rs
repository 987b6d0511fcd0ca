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
        source: hcl::edit::parser::Error,
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
