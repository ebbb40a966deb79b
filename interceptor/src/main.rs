fn main() -> std::process::ExitCode {
    interceptor::commands::main()
}
