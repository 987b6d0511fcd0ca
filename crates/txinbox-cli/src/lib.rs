//! The `txinbox` command and the library behind it: the benchmark ([`bench`](mod@bench)). The lab and the
//! failure windows it runs live in `txinbox-testkit`.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
