//! Debian's kernels, fetched through an apt configuration of the matrix's own under
//! `target/kernels/apt` (sources list, package lists, cache): the machine's apt configuration is
//! never read for sources nor written. Each series is pinned; the newest build of it in its
//! suites is resolved from the package index, which is refreshed once a day.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
    time::{Duration, SystemTime},
};

use anyhow::{Context as _, bail, ensure};

use crate::cmd;

const DEBIAN: &str = "http://deb.debian.org/debian";
const DEBIAN_SECURITY: &str = "http://deb.debian.org/debian-security";

/// A kernel series of the matrix and where Debian publishes it.
pub struct Series {
    /// How reports name it.
    pub name: &'static str,
    /// (archive, suite) pairs searched for its newest build.
    suites: &'static [(&'static str, &'static str)],
    /// The start of the package's ABI name (`5.10.` matches `linux-image-5.10.0-46-amd64`);
    /// `None` takes the newest kernel of the suites.
    abi_prefix: Option<&'static str>,
}

/// The kernels production nodes run (5.10 to 6.12) and the newest Debian ships. Generic
/// `-amd64` flavours only: the `-cloud` ones have no 9p, which the guests' root needs.
pub const SERIES: &[Series] = &[
    // bullseye-security has no `-unsigned` 5.10 image; the signed one boots the same.
    Series {
        name: "5.10",
        suites: &[(DEBIAN_SECURITY, "bullseye-security")],
        abi_prefix: Some("5.10."),
    },
    Series {
        name: "6.1",
        suites: &[(DEBIAN, "bookworm"), (DEBIAN_SECURITY, "bookworm-security")],
        abi_prefix: Some("6.1."),
    },
    Series {
        name: "6.12",
        suites: &[(DEBIAN, "trixie"), (DEBIAN_SECURITY, "trixie-security")],
        abi_prefix: Some("6.12."),
    },
    Series {
        name: "newest",
        suites: &[(DEBIAN, "trixie-backports")],
        abi_prefix: None,
    },
];

/// A kernel ready to boot.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub series: &'static str,
    /// The image package and its Debian version.
    pub package: String,
    pub version: String,
    pub suite: String,
    /// `uname -r` in the guest.
    pub release: String,
    pub vmlinuz: PathBuf,
}

/// The matrix's private apt state under `target/kernels/apt`.
pub struct Apt {
    dir: PathBuf,
}

impl Apt {
    pub fn new(kernels_dir: &Path) -> anyhow::Result<Self> {
        let dir = kernels_dir.join("apt");
        for sub in ["lists/partial", "cache/archives/partial", "debs"] {
            let path = dir.join(sub);
            fs::create_dir_all(&path)
                .with_context(|| format!("could not create {}", path.display()))?;
        }
        let apt = Self { dir };
        apt.write_sources()?;
        Ok(apt)
    }

    fn sources_file(&self) -> PathBuf {
        self.dir.join("sources.list")
    }

    /// One line per suite, Packages indexes only (no translations, no AppStream metadata).
    fn write_sources(&self) -> anyhow::Result<()> {
        let mut lines = String::new();
        for (archive, suite) in SERIES.iter().flat_map(|s| s.suites) {
            lines.push_str(&format!(
                "deb [arch=amd64 target=Packages signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] {archive} {suite} main\n"
            ));
        }
        let file = self.sources_file();
        fs::write(&file, lines).with_context(|| format!("could not write {}", file.display()))
    }

    /// `program` (apt-get) with every option that points apt at our files instead of the
    /// machine's.
    fn apt_get(&self) -> Command {
        let mut apt = Command::new("apt-get");
        let opt = |name: &str, value: &Path| format!("{name}={}", value.display());
        apt.arg("-o")
            .arg(opt("Dir::Etc::SourceList", &self.sources_file()))
            .args(["-o", "Dir::Etc::SourceParts=/dev/null"])
            .arg("-o")
            .arg(opt("Dir::State::Lists", &self.dir.join("lists")))
            .arg("-o")
            .arg(opt("Dir::Cache", &self.dir.join("cache")))
            // Downloads land in our own directory, which apt's `_apt` user may not enter.
            .args(["-o", "APT::Sandbox::User=root", "-qq"]);
        apt
    }

    /// Refreshes the package lists when they are missing or a day old. A failed refresh with
    /// lists on disk only warns: the kernels already cached keep the matrix running offline.
    pub fn update(&self) -> anyhow::Result<()> {
        let stamp = self.dir.join("updated");
        let fresh = fs::metadata(&stamp)
            .and_then(|meta| meta.modified())
            .is_ok_and(|at| {
                SystemTime::now()
                    .duration_since(at)
                    .is_ok_and(|age| age < Duration::from_secs(24 * 3600))
            });
        if fresh {
            return Ok(());
        }
        println!(
            "kernels: refreshing Debian's package lists (private, under {})...",
            self.dir.display()
        );
        match cmd::run(self.apt_get().arg("update")) {
            Ok(()) => fs::write(&stamp, "").context("could not stamp the package lists"),
            Err(err) if stamp.exists() => {
                eprintln!("kernels: warning: {err:#}; using the package lists of the last refresh");
                Ok(())
            }
            Err(err) => Err(err).context(
                "could not fetch Debian's package lists from deb.debian.org: the kernel matrix needs it once",
            ),
        }
    }

    /// The Packages stanzas of `suite`, as apt stored them (possibly compressed).
    fn stanzas(&self, suite: &str) -> anyhow::Result<Vec<Stanza>> {
        let targets = cmd::output(
            self.apt_get()
                .args(["indextargets", "--format", "$(RELEASE)\t$(FILENAME)"])
                .arg("Identifier: Packages"),
        )?;
        let file = targets
            .lines()
            .filter_map(|line| line.split_once('\t'))
            .find(|(release, _)| *release == suite)
            .map(|(_, file)| file.to_owned())
            .with_context(|| {
                format!(
                    "no package list for {suite}: remove {} and retry",
                    self.dir.display()
                )
            })?;
        let text = cmd::output(Command::new("/usr/lib/apt/apt-helper").args(["cat-file", &file]))?;
        Ok(text.split("\n\n").map(Stanza::parse).collect())
    }

    /// The newest generic amd64 build of `series`.
    pub fn resolve(&self, series: &Series) -> anyhow::Result<Resolved> {
        let mut best: Option<Resolved> = None;
        for (_, suite) in series.suites {
            for stanza in self.stanzas(suite)? {
                let (Some(package), Some(version)) = (stanza.get("Package"), stanza.get("Version"))
                else {
                    continue;
                };
                if !is_generic_image(package, series.abi_prefix) {
                    continue;
                }
                if best
                    .as_ref()
                    .is_some_and(|b| version_key(&b.version) >= version_key(version))
                {
                    continue;
                }
                // From 6.19 the image package is a small metapackage: the kernel itself is in
                // linux-binary-*, its modules in linux-modules-*.
                let mut packages = vec![package.to_owned()];
                packages.extend(
                    stanza
                        .get("Depends")
                        .unwrap_or_default()
                        .split([',', '|'])
                        .filter_map(|dep| dep.split_whitespace().next())
                        .filter(|dep| {
                            dep.starts_with("linux-binary-") || dep.starts_with("linux-modules-")
                        })
                        .map(str::to_owned),
                );
                best = Some(Resolved {
                    package: package.to_owned(),
                    version: version.to_owned(),
                    suite: (*suite).to_owned(),
                    packages,
                });
            }
        }
        best.with_context(|| {
            format!(
                "no generic amd64 kernel of series {} in {:?}: has Debian moved it? Update kernels::fetch::SERIES",
                series.name, series.suites
            )
        })
    }

    /// Downloads (once) and unpacks (once) `resolved` under `kernels_dir`, with its modules'
    /// index built, so the guest can load them.
    pub fn install(
        &self,
        series: &Series,
        resolved: &Resolved,
        kernels_dir: &Path,
    ) -> anyhow::Result<Kernel> {
        let name = format!("{}_{}", resolved.package, resolved.version);
        let root = kernels_dir.join(&name);
        if !root.join(".complete").exists() {
            let debs = self.download(resolved)?;
            let partial = kernels_dir.join(format!("{name}.partial"));
            let _ = fs::remove_dir_all(&partial);
            fs::create_dir_all(&partial)?;
            for deb in &debs {
                cmd::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(&partial))
                    .with_context(|| format!("could not unpack {}", deb.display()))?;
            }
            let (release, modules_base, _) = find_kernel(&partial)?;
            // Debian's packages ship no modules.dep; the guest's modprobe needs it.
            cmd::run(
                Command::new("depmod")
                    .arg("-b")
                    .arg(&modules_base)
                    .arg(&release),
            )
            .context("depmod (Debian package kmod) failed on the kernel's modules")?;
            fs::write(partial.join(".complete"), "")?;
            let _ = fs::remove_dir_all(&root);
            fs::rename(&partial, &root)
                .with_context(|| format!("could not move the kernel to {}", root.display()))?;
        }
        let (release, _, vmlinuz) = find_kernel(&root)?;
        Ok(Kernel {
            series: series.name,
            package: resolved.package.clone(),
            version: resolved.version.clone(),
            suite: resolved.suite.clone(),
            release,
            vmlinuz,
        })
    }

    fn download(&self, resolved: &Resolved) -> anyhow::Result<Vec<PathBuf>> {
        let debs_dir = self.dir.join("debs");
        let mut debs = Vec::new();
        for package in &resolved.packages {
            // apt names files with the version's `:` escaped; none of these versions has one.
            let file = debs_dir.join(format!("{package}_{}_amd64.deb", resolved.version));
            if !file.exists() {
                println!("kernels: downloading {package} {}...", resolved.version);
                cmd::run(
                    self.apt_get()
                        .current_dir(&debs_dir)
                        .arg("download")
                        .arg(format!("{package}={}", resolved.version)),
                )
                .with_context(|| format!("could not download {package} {}", resolved.version))?;
            }
            ensure!(file.exists(), "apt-get download left no {}", file.display());
            debs.push(file);
        }
        Ok(debs)
    }
}

/// A kernel build chosen from the index: the image package and what it needs to boot.
#[derive(Debug)]
pub struct Resolved {
    pub package: String,
    pub version: String,
    suite: String,
    packages: Vec<String>,
}

/// `linux-image-<abi>-amd64` of the generic flavour, whose ABI starts with `abi_prefix`.
fn is_generic_image(package: &str, abi_prefix: Option<&str>) -> bool {
    let Some(abi) = package
        .strip_prefix("linux-image-")
        .and_then(|rest| rest.strip_suffix("-amd64"))
    else {
        return false;
    };
    let generic = abi.starts_with(|c: char| c.is_ascii_digit())
        && !abi.ends_with("-cloud")
        && !abi.ends_with("-rt");
    generic && abi_prefix.is_none_or(|prefix| abi.starts_with(prefix))
}

/// Orders Debian versions of one kernel line by their numbers (`6.1.176-1` < `6.1.177-1`,
/// `7.3.4-1~bpo13+1`): enough for builds of one series, which differ in numbers only.
fn version_key(version: &str) -> Vec<u64> {
    version
        .split(|c: char| !c.is_ascii_digit())
        .filter(|part| !part.is_empty())
        .map(|part| part.parse().unwrap_or(u64::MAX))
        .collect()
}

/// In an unpacked kernel: its release, the base directory `depmod -b` takes (where
/// `lib/modules/<release>` is), and its vmlinuz (`boot/vmlinuz-<release>`, or from 6.19
/// `usr/lib/modules/<release>/vmlinuz`).
fn find_kernel(root: &Path) -> anyhow::Result<(String, PathBuf, PathBuf)> {
    for base in [root.to_owned(), root.join("usr")] {
        let modules = base.join("lib/modules");
        let Ok(entries) = fs::read_dir(&modules) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let release = entry.file_name().to_string_lossy().into_owned();
            for vmlinuz in [
                root.join("boot").join(format!("vmlinuz-{release}")),
                entry.path().join("vmlinuz"),
            ] {
                if vmlinuz.exists() {
                    return Ok((release, base, vmlinuz));
                }
            }
        }
    }
    bail!(
        "no lib/modules/<release> with a vmlinuz in {}: remove it and retry",
        root.display()
    )
}

/// One stanza of a Packages index.
struct Stanza(Vec<(String, String)>);

impl Stanza {
    fn parse(text: &str) -> Self {
        Self(
            text.lines()
                .filter(|line| !line.starts_with([' ', '\t']))
                .filter_map(|line| line.split_once(": "))
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
        )
    }

    fn get(&self, field: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == field)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_generic_images_of_the_series_match() {
        assert!(is_generic_image(
            "linux-image-5.10.0-46-amd64",
            Some("5.10.")
        ));
        assert!(is_generic_image("linux-image-6.1.0-50-amd64", Some("6.1.")));
        assert!(!is_generic_image(
            "linux-image-6.12.117+deb12-amd64",
            Some("6.1.")
        ));
        assert!(!is_generic_image(
            "linux-image-6.1.0-50-cloud-amd64",
            Some("6.1.")
        ));
        assert!(!is_generic_image(
            "linux-image-6.1.0-50-rt-amd64",
            Some("6.1.")
        ));
        assert!(!is_generic_image(
            "linux-image-6.1.0-50-amd64-unsigned",
            Some("6.1.")
        ));
        assert!(!is_generic_image("linux-image-amd64", None));
        assert!(is_generic_image("linux-image-7.3.4+deb13-amd64", None));
    }

    #[test]
    fn versions_order_by_their_numbers() {
        assert!(version_key("6.1.177-1") > version_key("6.1.176-1"));
        assert!(version_key("6.12.118-1") > version_key("6.12.99-1"));
        assert!(version_key("7.3.4-1~bpo13+1") > version_key("7.2.12-1~bpo13+1"));
    }
}
