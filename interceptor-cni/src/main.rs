//! The `interceptor-cni` binary: a runtime runs it with the CNI environment and the network
//! configuration on stdin.
#![forbid(unsafe_code)]
fn main() -> std::process::ExitCode {
    interceptor_cni::main()
}
