//! The `weir` binary: run the proxy, check a config, or run the demo.
#![forbid(unsafe_code)]

mod cli;

fn main() -> std::process::ExitCode {
    cli::main()
}
