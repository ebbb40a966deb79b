//! `linkerd-interceptor`: interceptor as a Linkerd extension. `linkerd check` runs
//! `linkerd-interceptor check --output=json` when a namespace is labelled
//! `linkerd.io/extension: interceptor` and this binary is on the PATH.
#![forbid(unsafe_code)]
fn main() -> std::process::ExitCode {
    interceptor::commands::check::linkerd_main()
}
