//! An OCI runtime for the podman and containerd tests: runc, minus the rlimits podman asks for
//! and the negative OOM score adjustment containerd's CRI gives a pod's sandbox (-998).
//! Containers on machines of this kind cannot get them (the sandbox withholds
//! CAP_SYS_RESOURCE, so runc's prlimit on the container's init, and its write of a lower
//! `oom_score_adj`, fail with EPERM); nothing the tests check depends on them.
use std::os::unix::process::CommandExt as _;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "create" || a == "run") {
        let bundle = args
            .iter()
            .position(|a| a == "--bundle" || a == "-b")
            .and_then(|i| args.get(i + 1))
            .map_or(".", String::as_str);
        let path = std::path::Path::new(bundle).join("config.json");
        let text = std::fs::read_to_string(&path).expect("the bundle's config.json");
        let mut config: serde_json::Value = serde_json::from_str(&text).expect("OCI config JSON");
        if let Some(process) = config.get_mut("process").and_then(|p| p.as_object_mut()) {
            process.remove("rlimits");
            process.remove("oomScoreAdj");
        }
        std::fs::write(&path, config.to_string()).expect("writing config.json");
    }
    let error = std::process::Command::new("runc").args(&args).exec();
    eprintln!("runc-without-rlimits: exec runc: {error}");
    std::process::exit(127);
}
