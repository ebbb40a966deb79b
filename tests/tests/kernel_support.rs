//! Every program variant on the running kernel (`interceptor kernel --json`): each loads exactly
//! when the feature probes say the kernel has what it needs, and `--mode auto` picks eBPF
//! exactly when every hook has such a variant. The kernel matrix (`cargo xtask test`) runs it in
//! every kernel it boots; the `variant:` and `feature:` lines it prints are the matrix's record
//! of what each kernel runs (the README's supported-kernels table).
use std::{collections::BTreeSet, process::Command};

use interceptor::ebpf::{
    features::{FEATURES_ENV, Feature},
    variants::{self, Hook},
};
use interceptor_tests::privileged;
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_interceptor-under-test");

fn kernel_report() -> Value {
    let out = Command::new(BIN)
        .args(["kernel", "--json"])
        .output()
        .expect("running interceptor kernel");
    assert!(
        out.status.success(),
        "interceptor kernel: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("interceptor kernel --json prints JSON")
}

#[test]
fn every_variant_loads_exactly_where_the_probes_say_it_can() {
    if !privileged() {
        return;
    }
    let report = kernel_report();
    let kernel = report["kernel"].as_str().unwrap_or_default().to_owned();
    let mut probed = BTreeSet::new();
    let mut usable = BTreeSet::new();
    for f in report["features"].as_array().expect("features") {
        let feature = Feature::ALL
            .into_iter()
            .find(|known| known.name() == f["name"])
            .expect("a known feature");
        println!(
            "feature: kernel={kernel} name={} present={}",
            feature.name(),
            f["probed"]
        );
        if f["probed"] == true {
            probed.insert(feature);
            if f["taken_away"] != true {
                usable.insert(feature);
            }
        }
    }
    let mut wrong = Vec::new();
    let mut hooks_with_a_usable_variant = BTreeSet::new();
    for v in report["variants"].as_array().expect("variants") {
        let program = v["program"].as_str().expect("program");
        let variant = variants::VARIANTS
            .iter()
            .find(|known| known.program == program)
            .expect("a known program");
        let loads = v["refused"].is_null();
        let refused = v["refused"].as_str().unwrap_or_default();
        println!(
            "variant: kernel={kernel} hook={} program={program} variant={} loads={loads} refused={refused}",
            variant.hook.describe(),
            variant.name
        );
        let can = variant.needs.iter().all(|f| probed.contains(f));
        if loads != can {
            wrong.push(format!(
                "{program} ({}): loads={loads}, but the probes say it {} ({refused})",
                variant.name,
                if can { "can" } else { "cannot" }
            ));
        }
        if loads && variant.needs.iter().all(|f| usable.contains(f)) {
            hooks_with_a_usable_variant.insert(variant.hook.describe());
        }
    }
    let every_hook = Hook::ALL.len() == hooks_with_a_usable_variant.len()
        && usable.contains(&Feature::SoNetnsCookie);
    let auto = report["auto_backend"].as_str().unwrap_or_default();
    println!(
        "auto: kernel={kernel} backend={auto} taken_away={} why={}",
        std::env::var(FEATURES_ENV).unwrap_or_default(),
        report["ebpf_unusable"].as_str().unwrap_or_default()
    );
    assert!(
        wrong.is_empty(),
        "on {kernel}, program variants disagree with the feature probes:\n{}",
        wrong.join("\n")
    );
    assert_eq!(
        auto,
        if every_hook { "ebpf" } else { "iptables" },
        "on {kernel}, --mode auto picks {auto}: {report:#}"
    );
}
