fn main() -> std::process::ExitCode {
    interceptor::cli::main()
}
