//! `interceptor kernel`: what this kernel offers the programs, and what `--mode auto` makes of
//! it. The kernel matrix (`cargo xtask test`) runs it in every kernel it boots.
use serde::Serialize;

use crate::{
    cli::KernelArgs,
    ebpf::{
        self,
        features::{Feature, KernelFeatures},
        variants,
    },
};

#[derive(Serialize)]
struct Report {
    kernel: String,
    features: Vec<FeatureReport>,
    variants: Vec<ebpf::VariantLoad>,
    /// What `--mode auto` picks, and why when it is not eBPF.
    auto_backend: &'static str,
    /// Where the variants this kernel runs make a connection land otherwise than proxy-init's
    /// chains: "hook (variant): how".
    differs_from_proxy_init: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ebpf_unusable: Option<String>,
}

#[derive(Serialize)]
struct FeatureReport {
    name: &'static str,
    description: &'static str,
    probed: bool,
    taken_away: bool,
}

pub fn kernel(args: KernelArgs) -> anyhow::Result<()> {
    let features = KernelFeatures::get();
    let probe = ebpf::probe();
    let report = Report {
        kernel: nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default(),
        features: Feature::ALL
            .into_iter()
            .map(|f| FeatureReport {
                name: f.name(),
                description: f.describe(),
                probed: features.probed.contains(&f),
                taken_away: features.taken_away.contains(&f),
            })
            .collect(),
        variants: ebpf::load_every_variant().map_err(anyhow::Error::msg)?,
        auto_backend: if probe.is_ok() { "ebpf" } else { "iptables" },
        differs_from_proxy_init: variants::choose(features)
            .map(|chosen| {
                chosen
                    .iter()
                    .filter_map(|(hook, variant, _)| {
                        let how = variant.differs?;
                        Some(format!("{} ({}): {how}", hook.describe(), variant.name))
                    })
                    .collect()
            })
            .unwrap_or_default(),
        ebpf_unusable: probe.err(),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("kernel {}", report.kernel);
    for f in &report.features {
        let state = match (f.probed, f.taken_away) {
            (true, false) => "yes",
            (true, true) => "yes, taken away",
            (false, _) => "no",
        };
        println!("  feature {:<24} {state:<16} {}", f.name, f.description);
    }
    for v in &report.variants {
        let result = match &v.refused {
            None => "loads".to_owned(),
            Some(why) => format!("refused: {why}"),
        };
        println!(
            "  variant {:<16} {:<22} {:<8} {result}",
            v.program, v.hook, v.variant
        );
    }
    for how in &report.differs_from_proxy_init {
        println!("  differs from proxy-init: {how}");
    }
    match &report.ebpf_unusable {
        None => println!("--mode auto: ebpf"),
        Some(why) => println!("--mode auto: iptables, because {why}"),
    }
    Ok(())
}
