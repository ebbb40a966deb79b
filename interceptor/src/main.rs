#![forbid(unsafe_code)]
fn main() -> std::process::ExitCode {
    interceptor::commands::main()
}
