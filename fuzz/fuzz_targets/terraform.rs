//! check-infra's Terraform reader and rules on an arbitrary `main.tf`: never a panic; a file is checked
//! (a report) or refused with a typed error naming the file (parse error) or the reason (no queue, a module
//! or variable it cannot read).
#![no_main]

use std::path::PathBuf;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use txinbox_infra::{check_dir, CheckError, WorkerSettings};

fn dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("txinbox-fuzz-terraform-{}", std::process::id()));
        std::fs::create_dir_all(&d).expect("a temporary directory");
        d
    })
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let dir = dir();
    std::fs::write(dir.join("main.tf"), text).expect("write main.tf");
    match check_dir(dir, &WorkerSettings::default()) {
        Ok(report) => {
            assert!(report.sqs_queues + report.servicebus_queues > 0);
            for v in &report.violations {
                assert!(!v.to_string().is_empty());
            }
        }
        Err(CheckError::Output(e)) => panic!("an output error without output: {e:?}"),
        Err(e) => assert!(!e.to_string().is_empty()),
    }
});
