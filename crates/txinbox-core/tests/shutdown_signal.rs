//! `shutdown_signal()` installs its handlers when it is called, inside a runtime: a SIGTERM sent before the
//! future is first polled (while a program still connects and checks at start) is kept and resolves it, where
//! the signal's default action would have ended the process. One test in its own file: the signal goes to the
//! whole test process.
#![cfg(unix)]

use std::time::Duration;

#[tokio::test]
async fn a_sigterm_sent_before_the_first_poll_is_kept_and_resolves_it() {
    let signal = txinbox_core::shutdown_signal();
    let kill = std::process::Command::new("kill")
        .args(["-TERM", &std::process::id().to_string()])
        .status()
        .expect("run kill(1)");
    assert!(kill.success(), "kill -TERM failed: {kill}");
    // Had the handler waited for the first poll, the process would have died of the signal by now.
    tokio::time::timeout(Duration::from_secs(10), signal)
        .await
        .expect("the SIGTERM sent before the first poll resolves the future");
}
