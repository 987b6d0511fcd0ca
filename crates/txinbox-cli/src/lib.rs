//! The `txinbox` command and the library behind it: the seed's lab ([`lab`]), the failure windows
//! ([`windows`]), the benchmark ([`bench`](mod@bench)) and the redrive commands' progress ([`redrive`]).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod lab;
pub mod labdb;
pub mod redrive;
pub mod windows;
