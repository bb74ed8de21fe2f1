//! The `weir` binary: run the proxy, check a config, or run the demo.
#![forbid(unsafe_code)]

mod cli;

#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    cli::main()
}
