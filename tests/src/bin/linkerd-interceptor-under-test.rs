//! The `linkerd-interceptor` binary, built inside this package so its tests can run it through
//! `CARGO_BIN_EXE_linkerd-interceptor-under-test`. Same entry point as the real one.
fn main() -> std::process::ExitCode {
    interceptor::commands::check::linkerd_main()
}
