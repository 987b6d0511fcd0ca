//! The model the property tests of two stores share (feature `prop`): generated deliveries, effects and
//! effect transitions, the operator's asked consumers and tables, and the normalisers that make a store's
//! answers comparable with another's (dates as both keep them, a time the pipeline took from the wall clock
//! as the hour it is in, ids each store numbers its own way).
//!
//! What a test generates differently on purpose (text within a store's key limits, its dates) it says
//! through [`Values`]; every generator here draws its text and dates from there.
//!
//! `values` holds the generators and what a test builds from their values, `outcome` the normalisers and
//! [`Outcome`], `run` what a step keeps and the deliveries' run through the pipeline.

use chrono::{DateTime, Utc};
use proptest::prelude::*;

mod outcome;
mod run;
mod values;

pub use outcome::*;
pub use run::*;
pub use values::*;

/// The values a test draws its own way: free text (a store's key limits decide which) and dates.
pub trait Values {
    /// Text from outside.
    fn text() -> impl Strategy<Value = String>;

    /// A date: by default [`time`].
    fn time() -> impl Strategy<Value = DateTime<Utc>> {
        time()
    }
}
