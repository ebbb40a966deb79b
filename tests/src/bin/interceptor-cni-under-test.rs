//! The CNI plugin, built inside this package so its tests can run it through
//! `CARGO_BIN_EXE_interceptor-cni-under-test`. Same entry point as `interceptor-cni`.
fn main() -> std::process::ExitCode {
    interceptor_cni::main()
}
