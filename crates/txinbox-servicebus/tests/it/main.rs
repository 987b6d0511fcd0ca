//! Integration tests of the Service Bus adapter: the real adapter, through the real `azure_messaging_servicebus`
//! crate, against the emulator (`txinbox-sb-emulator`, started in this test process) and real PostgreSQL; a
//! fresh queue and a fresh schema per test.
//!
//! ```sh
//! TXINBOX_TEST_PG_URL=postgres://postgres@127.0.0.1:5432/test cargo test -p txinbox-servicebus
//! ```

mod batch;
mod common;
mod contract;
mod dead_letters;
mod faults;
mod non_ascii;
mod scenarios;
mod shutdown;
mod startup;
