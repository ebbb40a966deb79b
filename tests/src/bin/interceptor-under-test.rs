//! The `interceptor` command line, built inside this package so the CLI tests can run it through
//! `CARGO_BIN_EXE_interceptor-under-test` (cargo only exposes a package's own binaries to its
//! tests). Same entry point as the real binary: `interceptor::commands::main`.
fn main() -> std::process::ExitCode {
    interceptor::commands::main()
}
