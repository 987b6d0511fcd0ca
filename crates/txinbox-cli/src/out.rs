//! Standard output of every command. Everything the command prints goes through [`outln!`] / [`out!`] (or the
//! [`Stdout`] writer), never `println!` (which panics when the write fails; `clippy::print_stdout` refuses it in
//! this crate):
//!
//! * the reader went away (`txinbox inbox stats ... | head -1`: a broken pipe) is the end of output: the process
//!   stops writing and exits at once with [`BROKEN_PIPE_EXIT`], printing nothing;
//! * any other write error (a full disk under `> file`) is reported, `error: writing to standard output: ...`
//!   on stderr, and the process exits 2.
//!
//! What goes to standard error goes through [`errln!`], never `eprintln!` (`clippy::print_stderr` refuses it):
//! a message to a standard error that is gone is dropped, not a panic.

use std::io::{self, Write};

/// The exit status when the reader of standard output went away: 141, what a shell reports for a process ended
/// by SIGPIPE (128 + 13), as for `yes | head -1` and the other Unix tools that do not catch it. Not 0: the
/// command's own verdict (1 nothing found, 3 budget exhausted, a failed window) was not all delivered, and a
/// script under `set -o pipefail` must not read cut output as a success. Not 2: nothing went wrong that an
/// operator has to act on, so nothing is printed.
pub const BROKEN_PIPE_EXIT: u8 = 141;

/// Writes `args` to standard output and flushes it; see the module for what a failed write does.
pub fn write_fmt(args: std::fmt::Arguments<'_>) {
    let mut out = io::stdout().lock();
    if let Err(e) = out.write_fmt(args).and_then(|()| out.flush()) {
        stop(&e)
    }
}

/// `println!` through [`write_fmt`].
macro_rules! outln {
    () => {
        $crate::out::write_fmt(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// `print!` through [`write_fmt`].
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::out::write_fmt(format_args!($($arg)*))
    };
}

/// `eprintln!` without its panic: a message to standard error, dropped if standard error is gone (there is
/// nowhere left to report it; the exit status still tells).
macro_rules! errln {
    () => {
        $crate::out::write_err(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::out::write_err(format_args!("{}\n", format_args!($($arg)*)))
    };
}

pub(crate) use {errln, out, outln};

/// Writes `args` to standard error, ignoring a failed write; see [`errln!`].
pub fn write_err(args: std::fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// Standard output as a writer, for code that writes to an `impl Write` (check-infra's report): a broken pipe
/// ends the process as [`write_fmt`] does; any other error is returned to the caller, which reports it.
pub struct Stdout(io::StdoutLock<'static>);

impl Stdout {
    /// Locks standard output for this writer.
    pub fn lock() -> Self {
        Self(io::stdout().lock())
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf).inspect_err(end_on_broken_pipe)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush().inspect_err(end_on_broken_pipe)
    }
}

fn end_on_broken_pipe(e: &io::Error) {
    if e.kind() == io::ErrorKind::BrokenPipe {
        std::process::exit(BROKEN_PIPE_EXIT.into());
    }
}

/// Ends the process on a failed write to standard output.
fn stop(e: &io::Error) -> ! {
    end_on_broken_pipe(e);
    write_err(format_args!("error: writing to standard output: {e}\n"));
    std::process::exit(2)
}

/// Values from outside (a destination's reference and error text, a dead letter's id, a Terraform file's string
/// quoted by an error) are written through it; `--json` keeps them as they are.
pub use txinbox_core::error::escape_untrusted as escaped;
