//! `txinbox-bench`: the benchmark, a command of its own beside the operator's `txinbox`.

use std::process::ExitCode;

use clap::Parser;

/// Benchmark: the same handler bare, with the inbox, and on a duplicate-heavy stream, plus pgbench on the
/// inbox's own SQL, at each concurrency.
#[derive(Parser)]
#[command(name = "txinbox-bench", version)]
struct Cli {
    #[command(flatten)]
    args: txinbox_bench::BenchArgs,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("TXINBOX_LOG")
                .unwrap_or_else(|_| "error".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => return fail(&e),
    };
    match rt.block_on(txinbox_bench::run(cli.args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(e: &dyn std::error::Error) -> ExitCode {
    let mut msg = format!("error: {e}");
    let mut src = e.source();
    while let Some(s) = src {
        msg.push_str(&format!("\n  caused by: {s}"));
        src = s.source();
    }
    eprintln!("{msg}");
    ExitCode::from(2)
}
