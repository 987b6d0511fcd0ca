//! The benchmark without the rest of the CLI: `cargo run --release -p txinbox-bench --example bench -- --store
//! postgres://...` takes the arguments of `txinbox bench`.

use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: txinbox_bench::BenchArgs,
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(txinbox_bench::run(cli.args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
