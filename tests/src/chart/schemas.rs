//! The rendered manifests checked against Kubernetes' schemas by kubernetes-validate (which
//! `cargo xtask setup` installs and puts first on PATH).
use std::process::Command;

use crate::{command::run, unique_name};

/// kubernetes-validate's version is the newest Kubernetes whose schemas it ships (1.37.0 ships
/// 1.25 to 1.37; `cargo xtask setup` pins it).
pub fn newest_schemas() -> String {
    run(Command::new("kubernetes-validate").arg("--version"), None)
        .trim()
        .to_owned()
}

/// kubernetes-validate's report on `yaml` against Kubernetes `version`, strictly (a field the
/// schema does not know is refused); `Err` when it refuses.
pub fn validate(yaml: &str, version: &str) -> Result<String, String> {
    let file = std::env::temp_dir().join(format!("{}.yaml", unique_name("manifests")));
    std::fs::write(&file, yaml).unwrap();
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--kubernetes-version", version])
        .arg(&file)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&file);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}
