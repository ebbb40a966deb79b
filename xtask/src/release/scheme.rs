//! The release scheme on text alone: where the version is written, what the changelog records,
//! and the edits a cut makes. Reading files and asking git are `release`'s.
use std::fmt;

use anyhow::{Context as _, bail, ensure};

/// A semantic version, `MAJOR.MINOR.PATCH` with an optional `-pre-release`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Version {
    pub core: (u64, u64, u64),
    pub pre: Option<String>,
}

impl Version {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let invalid = || format!("{text:?} is not a semantic version (MAJOR.MINOR.PATCH[-PRE])");
        let (core, pre) = match text.split_once('-') {
            Some((core, pre)) => (core, Some(pre)),
            None => (text, None),
        };
        let mut parts = core.split('.').map(|part| {
            // No leading zeros: semver forbids them, and "01" would name the same release as "1".
            (part == "0" || !part.starts_with('0'))
                .then(|| part.parse::<u64>().ok())
                .flatten()
        });
        let (Some(Some(major)), Some(Some(minor)), Some(Some(patch)), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            bail!(invalid());
        };
        if let Some(pre) = pre {
            ensure!(
                !pre.is_empty()
                    && pre
                        .split('.')
                        .all(|id| !id.is_empty() && id.chars().all(|c| c.is_ascii_alphanumeric())),
                invalid()
            );
        }
        Ok(Self {
            core: (major, minor, patch),
            pre: pre.map(str::to_owned),
        })
    }

    /// Whether `self` comes after `earlier`. Pre-releases order by their text, which is enough
    /// for the `-rc.N` (N < 10) this project would use.
    pub fn is_after(&self, earlier: &Self) -> bool {
        match self.core.cmp(&earlier.core) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Less => false,
            std::cmp::Ordering::Equal => match (&self.pre, &earlier.pre) {
                (None, Some(_)) => true,
                (Some(new), Some(old)) => new > old,
                _ => false,
            },
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor, patch) = self.core;
        write!(f, "{major}.{minor}.{patch}")?;
        if let Some(pre) = &self.pre {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}

/// What a changelog entry's `Commit:` line says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commit {
    /// A full 40-digit hash.
    Hash(String),
    /// The release commit a cut is making, which cannot name itself; the cut's next commit
    /// writes its hash here.
    Pending,
}

/// What kind of entry a changelog heading opens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    /// `## [1.2.3] - 2026-12-01`
    Release,
    /// `## Baseline 0.1.0 - 2026-11-27`: a commit that was never released, recorded as where
    /// the upgrade test starts before the first release.
    Baseline,
}

/// One released (or baseline) entry of the changelog.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub kind: Kind,
    pub version: Version,
    pub commit: Commit,
    /// The heading line as written, to name the entry in messages.
    pub heading: String,
}

/// CHANGELOG.md, as far as the scheme reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Changelog {
    /// The lines under `## [Unreleased]` that say something (not blank, not only a `###`
    /// heading).
    pub unreleased: Vec<String>,
    /// Newest first.
    pub entries: Vec<Entry>,
}

pub const UNRELEASED: &str = "## [Unreleased]";
const COMMIT: &str = "Commit: ";

impl Changelog {
    pub fn parse(text: &str) -> anyhow::Result<Self> {
        let mut unreleased = None::<Vec<String>>;
        let mut entries = Vec::<Entry>::new();
        // Entries whose `Commit:` line was read.
        let mut recorded = 0;
        for (number, line) in text.lines().enumerate() {
            let at = || format!("CHANGELOG.md line {}", number + 1);
            if line == UNRELEASED {
                ensure!(
                    unreleased.is_none() && entries.is_empty(),
                    "{}: {UNRELEASED} must come once, before every release",
                    at()
                );
                unreleased = Some(Vec::new());
            } else if let Some(heading) = line.strip_prefix("## ") {
                let entry = parse_heading(heading).with_context(at)?;
                ensure!(
                    unreleased.is_some(),
                    "{}: {UNRELEASED} must come before every release",
                    at()
                );
                if let Some(newer) = entries.last() {
                    ensure!(
                        recorded == entries.len(),
                        "{}: {} has no {COMMIT:?} line",
                        at(),
                        newer.heading
                    );
                    ensure!(
                        newer.version.is_after(&entry.version),
                        "{}: {} comes after {} but is not older",
                        at(),
                        entry.version,
                        newer.version
                    );
                }
                entries.push(Entry {
                    heading: line.to_owned(),
                    ..entry
                });
            } else if let Some(commit) = line.strip_prefix(COMMIT) {
                let count = entries.len();
                let Some(entry) = entries.last_mut() else {
                    bail!("{}: a {COMMIT:?} line belongs to a release", at());
                };
                ensure!(
                    recorded < count,
                    "{}: {} records a second commit",
                    at(),
                    entry.heading
                );
                entry.commit = parse_commit(commit.trim()).with_context(at)?;
                ensure!(
                    entry.commit != Commit::Pending || count == 1,
                    "{}: only the newest release's commit can be pending (a cut's next commit \
                     records it)",
                    at()
                );
                recorded += 1;
            } else if entries.is_empty()
                && let Some(lines) = &mut unreleased
                && !line.trim().is_empty()
                && !line.starts_with("### ")
            {
                lines.push(line.to_owned());
            }
        }
        let Some(unreleased) = unreleased else {
            bail!("CHANGELOG.md has no {UNRELEASED} section");
        };
        if let Some(last) = entries.last() {
            ensure!(
                recorded == entries.len(),
                "CHANGELOG.md: {} has no {COMMIT:?} line",
                last.heading
            );
        }
        Ok(Self {
            unreleased,
            entries,
        })
    }

    /// The newest release or baseline: what the versions must agree with.
    pub fn latest(&self) -> anyhow::Result<&Entry> {
        self.entries
            .first()
            .context("CHANGELOG.md records no release and no baseline")
    }
}

fn parse_heading(heading: &str) -> anyhow::Result<Entry> {
    let (kind, rest) = if let Some(rest) = heading.strip_prefix('[') {
        let (version, rest) = rest
            .split_once(']')
            .with_context(|| format!("heading {heading:?}: no `]` after the version"))?;
        (Kind::Release, (version, rest))
    } else if let Some(rest) = heading.strip_prefix("Baseline ") {
        let (version, rest) = rest.split_at(rest.find(' ').unwrap_or(rest.len()));
        (Kind::Baseline, (version, rest))
    } else {
        bail!(
            "heading {heading:?} is neither `## [VERSION] - YYYY-MM-DD` nor `## Baseline VERSION - YYYY-MM-DD`"
        );
    };
    let (version, rest) = rest;
    let date = rest.strip_prefix(" - ").with_context(|| {
        format!("heading {heading:?}: expected \" - YYYY-MM-DD\" after the version")
    })?;
    ensure!(
        is_date(date),
        "heading {heading:?}: {date:?} is not a date (YYYY-MM-DD)"
    );
    Ok(Entry {
        kind,
        version: Version::parse(version).with_context(|| format!("heading {heading:?}"))?,
        commit: Commit::Pending,
        heading: String::new(),
    })
}

fn parse_commit(text: &str) -> anyhow::Result<Commit> {
    if text == "pending" {
        return Ok(Commit::Pending);
    }
    ensure!(
        text.len() == 40
            && text
                .chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase()),
        "{text:?} is not a full commit hash (40 lowercase hex digits, as `git rev-parse` prints)"
    );
    Ok(Commit::Hash(text.to_owned()))
}

fn is_date(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.len() == 10
        && bytes.iter().enumerate().all(|(i, b)| {
            if i == 4 || i == 7 {
                *b == b'-'
            } else {
                b.is_ascii_digit()
            }
        })
}

/// One place a version is written, as found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Place {
    /// Where, as a person would look it up: `charts/interceptor/Chart.yaml appVersion`.
    pub name: String,
    pub version: String,
}

/// `[workspace.package] version` of the root Cargo.toml: the one source of the crates' versions,
/// hence of the binaries' `--version`, the image tag and `interceptor_build_info`.
pub fn workspace_version(cargo_toml: &str) -> anyhow::Result<Place> {
    let mut section = "";
    for line in cargo_toml.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            section = line;
        } else if section == "[workspace.package]"
            && let Some(value) = toml_string(line, "version")
        {
            return Ok(Place {
                name: "Cargo.toml [workspace.package] version".into(),
                version: value.to_owned(),
            });
        }
    }
    bail!("Cargo.toml has no `version = \"...\"` under [workspace.package]")
}

fn toml_string<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let value = line
        .strip_prefix(key)?
        .trim_start()
        .strip_prefix('=')?
        .trim();
    value.strip_prefix('"')?.strip_suffix('"')
}

/// The chart's `version` and `appVersion`. Helm cannot read Cargo.toml, so they are written
/// out and checked equal to the workspace's.
pub fn chart_versions(chart_yaml: &str) -> anyhow::Result<[Place; 2]> {
    let find = |key: &str| {
        chart_yaml
            .lines()
            .find_map(|line| line.strip_prefix(key)?.strip_prefix(": "))
            .map(|value| Place {
                name: format!("charts/interceptor/Chart.yaml {key}"),
                version: value.trim().trim_matches('"').to_owned(),
            })
            .with_context(|| format!("charts/interceptor/Chart.yaml has no top-level `{key}:`"))
    };
    Ok([find("version")?, find("appVersion")?])
}

/// The versions a Cargo.lock holds for the workspace's own packages (those without a
/// `source`), by name.
pub fn lock_versions(lock: &str, file: &str) -> Vec<(String, Place)> {
    lock.split("[[package]]")
        .skip(1)
        .filter(|package| !package.lines().any(|line| line.starts_with("source = ")))
        .filter_map(|package| {
            let name = package.lines().find_map(|l| toml_string(l, "name"))?;
            let version = package.lines().find_map(|l| toml_string(l, "version"))?;
            Some((
                name.to_owned(),
                Place {
                    name: format!("{file} package {name}"),
                    version: version.to_owned(),
                },
            ))
        })
        .collect()
}

/// Every place named must hold `expected`'s version; the error names both places.
pub fn check_agree(expected: &Place, places: &[Place]) -> anyhow::Result<()> {
    let differing: Vec<String> = places
        .iter()
        .filter(|place| place.version != expected.version)
        .map(|place| format!("{} is {:?}", place.name, place.version))
        .collect();
    ensure!(
        differing.is_empty(),
        "the versions disagree: {} is {:?}, but {} (cargo xtask release cut VERSION writes them all)",
        expected.name,
        expected.version,
        differing.join(", ")
    );
    Ok(())
}

/// The changelog's newest entry as a place a version is written.
pub fn changelog_place(entry: &Entry) -> Place {
    Place {
        name: format!("CHANGELOG.md's newest entry ({})", entry.heading),
        version: entry.version.to_string(),
    }
}

/// The changelog with Unreleased moved under a new release heading whose commit is pending,
/// and an empty Unreleased above it.
pub fn cut_changelog(text: &str, version: &Version, date: &str) -> anyhow::Result<String> {
    let start = text
        .lines()
        .position(|line| line == UNRELEASED)
        .with_context(|| format!("CHANGELOG.md has no {UNRELEASED} section"))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        out.push(line.to_owned());
        if i == start {
            out.push(String::new());
            out.push(format!("## [{version}] - {date}"));
            out.push(String::new());
            out.push(format!("{COMMIT}pending"));
        }
    }
    Ok(out.join("\n") + "\n")
}

/// Writes `commit` in place of the pending commit a cut left.
pub fn record_commit(text: &str, commit: &str) -> anyhow::Result<String> {
    let pending = format!("{COMMIT}pending");
    ensure!(
        text.lines().filter(|line| *line == pending).count() == 1,
        "CHANGELOG.md should hold one {pending:?} line, written by the cut"
    );
    Ok(text.replacen(&pending, &format!("{COMMIT}{commit}"), 1))
}

/// Cargo.toml with `[workspace.package] version` set to `version`.
pub fn set_workspace_version(cargo_toml: &str, version: &Version) -> anyhow::Result<String> {
    let mut section = String::new();
    let mut done = false;
    let lines: Vec<String> = cargo_toml
        .lines()
        .map(|line| {
            let trimmed = line.trim();
            if trimmed.starts_with('[') {
                section = trimmed.to_owned();
            } else if !done
                && section == "[workspace.package]"
                && toml_string(trimmed, "version").is_some()
            {
                done = true;
                return format!("version = \"{version}\"");
            }
            line.to_owned()
        })
        .collect();
    ensure!(done, "Cargo.toml has no version under [workspace.package]");
    Ok(lines.join("\n") + "\n")
}

/// Chart.yaml with `version` and `appVersion` set to `version`.
pub fn set_chart_versions(chart_yaml: &str, version: &Version) -> String {
    let lines: Vec<String> = chart_yaml
        .lines()
        .map(|line| {
            for key in ["version", "appVersion"] {
                if line.starts_with(&format!("{key}: ")) {
                    return format!("{key}: {version}");
                }
            }
            line.to_owned()
        })
        .collect();
    lines.join("\n") + "\n"
}

/// A Cargo.lock with the workspace packages named in `names` at `version`.
pub fn set_lock_versions(lock: &str, names: &[String], version: &Version) -> String {
    let mut parts = lock.split("[[package]]");
    let mut out = parts.next().unwrap_or_default().to_owned();
    for package in parts {
        out.push_str("[[package]]");
        let ours = !package.lines().any(|line| line.starts_with("source = "))
            && package
                .lines()
                .find_map(|l| toml_string(l, "name"))
                .is_some_and(|name| names.iter().any(|n| n == name));
        if !ours {
            out.push_str(package);
            continue;
        }
        let mut done = false;
        let lines: Vec<String> = package
            .split('\n')
            .map(|line| {
                if !done && toml_string(line, "version").is_some() {
                    done = true;
                    format!("version = \"{version}\"")
                } else {
                    line.to_owned()
                }
            })
            .collect();
        out.push_str(&lines.join("\n"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const HASH_A: &str = "07eb428a3e9e05ebda51ddcfc7bc36582dab705a";
    const HASH_B: &str = "c33d0fb0000000000000000000000000000000aa";

    fn changelog(unreleased: &str) -> String {
        format!(
            "# Changelog\n\nIntro.\n\n## [Unreleased]\n\n{unreleased}\n## [0.2.0] - 2026-12-01\n\n\
         Commit: {HASH_B}\n\n### Added\n\n- things\n\n## Baseline 0.1.0 - 2026-11-27\n\n\
         Commit: {HASH_A}\n\nNot a release.\n"
        )
    }

    fn v(text: &str) -> Version {
        Version::parse(text).unwrap()
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(v("1.2.3").core, (1, 2, 3));
        assert_eq!(v("1.2.3-rc.1").pre.as_deref(), Some("rc.1"));
        assert_eq!(v("0.10.0-rc.1").to_string(), "0.10.0-rc.1");
        for bad in [
            "1.2",
            "1.2.3.4",
            "01.2.3",
            "1.2.x",
            "v1.2.3",
            "1.2.3-",
            "1.2.3-a..b",
            "",
        ] {
            assert!(Version::parse(bad).is_err(), "{bad:?} parsed");
        }
        assert!(v("0.2.0").is_after(&v("0.1.0")));
        assert!(v("0.10.0").is_after(&v("0.9.0")));
        assert!(v("1.0.0").is_after(&v("1.0.0-rc.2")));
        assert!(v("1.0.0-rc.2").is_after(&v("1.0.0-rc.1")));
        assert!(!v("0.1.0").is_after(&v("0.1.0")));
        assert!(!v("1.0.0-rc.1").is_after(&v("1.0.0")));
    }

    #[test]
    fn changelog_parses_entries_newest_first() {
        let parsed = Changelog::parse(&changelog("### Added\n\n- a new flag\n")).unwrap();
        assert_eq!(parsed.unreleased, ["- a new flag"]);
        let [release, baseline] = &parsed.entries[..] else {
            panic!("{parsed:?}");
        };
        assert_eq!(release.kind, Kind::Release);
        assert_eq!(release.version, v("0.2.0"));
        assert_eq!(release.commit, Commit::Hash(HASH_B.into()));
        assert_eq!(release.heading, "## [0.2.0] - 2026-12-01");
        assert_eq!(baseline.kind, Kind::Baseline);
        assert_eq!(baseline.version, v("0.1.0"));
        assert_eq!(baseline.commit, Commit::Hash(HASH_A.into()));
    }

    #[test]
    fn unreleased_with_headings_only_is_empty() {
        let parsed = Changelog::parse(&changelog("### Added\n\n### Fixed\n\n")).unwrap();
        assert!(parsed.unreleased.is_empty());
    }

    #[test]
    fn changelog_mistakes_are_refused_with_their_line() {
        let cases = [
            (
                changelog("").replace("## [Unreleased]", "## Unreleased"),
                "line 5",
            ),
            (
                changelog("").replace(&format!("Commit: {HASH_B}\n"), ""),
                "has no",
            ),
            (
                changelog("").replace(HASH_B, "c33d0fb"),
                "not a full commit hash",
            ),
            (changelog("").replace("2026-12-01", "Dec 1"), "not a date"),
            (changelog("").replace("[0.2.0]", "[0.1.0]"), "is not older"),
            (changelog("").replace(HASH_A, "pending"), "only the newest"),
            (
                changelog("").replace("## [Unreleased]\n", "") + "## [Unreleased]\n",
                "## [Unreleased] must come",
            ),
        ];
        for (text, expected) in cases {
            let err = format!("{:#}", Changelog::parse(&text).unwrap_err());
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        }
    }

    #[test]
    fn the_newest_entry_may_be_pending() {
        let text = changelog("").replace(HASH_B, "pending");
        let parsed = Changelog::parse(&text).unwrap();
        assert_eq!(parsed.latest().unwrap().commit, Commit::Pending);
    }

    #[test]
    fn places_are_read_where_they_are_written() {
        let cargo = "[workspace]\nmembers = []\n\n[workspace.package]\nversion = \"0.2.0\"\n\
                 edition = \"2024\"\n\n[workspace.dependencies]\nclap = { version = \"4\" }\n";
        assert_eq!(workspace_version(cargo).unwrap().version, "0.2.0");
        let chart = "apiVersion: v2\nname: interceptor\nversion: 0.2.0\nappVersion: \"0.2.0\"\n";
        let [version, app] = chart_versions(chart).unwrap();
        assert_eq!(
            (version.version.as_str(), app.version.as_str()),
            ("0.2.0", "0.2.0")
        );
        let lock = "version = 4\n\n[[package]]\nname = \"clap\"\nversion = \"4.5.0\"\n\
                source = \"registry+https://github.com/rust-lang/crates.io-index\"\n\n\
                [[package]]\nname = \"interceptor\"\nversion = \"0.2.0\"\ndependencies = []\n";
        let ours = lock_versions(lock, "Cargo.lock");
        assert_eq!(ours.len(), 1);
        assert_eq!(ours[0].0, "interceptor");
        assert_eq!(ours[0].1.name, "Cargo.lock package interceptor");
    }

    #[test]
    fn a_mismatch_names_both_places() {
        let chart = "version: 0.2.0\nappVersion: 0.1.0\n";
        let workspace = workspace_version("[workspace.package]\nversion = \"0.2.0\"\n").unwrap();
        let err = check_agree(&workspace, &chart_versions(chart).unwrap()).unwrap_err();
        let err = err.to_string();
        assert!(
            err.contains("Cargo.toml [workspace.package] version is \"0.2.0\"")
                && err.contains("charts/interceptor/Chart.yaml appVersion is \"0.1.0\"")
                && !err.contains("Chart.yaml version is"),
            "{err}"
        );
        let entry = Changelog::parse(&changelog("")).unwrap().entries[1].clone();
        let err = check_agree(&workspace, &[changelog_place(&entry)]).unwrap_err();
        assert!(
            err.to_string().contains(
                "CHANGELOG.md's newest entry (## Baseline 0.1.0 - 2026-11-27) is \"0.1.0\""
            ),
            "{err}"
        );
    }

    #[test]
    fn a_cut_moves_unreleased_and_bumps_every_place() {
        let text = changelog("### Added\n\n- a new flag\n");
        let cut = cut_changelog(&text, &v("0.3.0"), "2026-12-24").unwrap();
        let parsed = Changelog::parse(&cut).unwrap();
        assert!(parsed.unreleased.is_empty(), "{cut}");
        let newest = parsed.latest().unwrap();
        assert_eq!(newest.heading, "## [0.3.0] - 2026-12-24");
        assert_eq!(newest.commit, Commit::Pending);
        assert!(
            cut.contains("Commit: pending\n\n### Added\n\n- a new flag\n"),
            "{cut}"
        );

        let recorded = record_commit(&cut, HASH_A).unwrap();
        let newest = Changelog::parse(&recorded).unwrap().entries[0].clone();
        assert_eq!(newest.commit, Commit::Hash(HASH_A.into()));
        assert!(record_commit(&recorded, HASH_A).is_err());

        let cargo = "[workspace]\n[workspace.package]\nversion = \"0.2.0\"\n\n\
                 [workspace.dependencies]\nx = { version = \"1\" }\n";
        let bumped = set_workspace_version(cargo, &v("0.3.0")).unwrap();
        assert_eq!(
            bumped,
            cargo.replace("version = \"0.2.0\"", "version = \"0.3.0\"")
        );
        assert_eq!(
            set_chart_versions(
                "name: x\nversion: 0.2.0\nappVersion: 0.2.0\nkubeVersion: 1\n",
                &v("0.3.0")
            ),
            "name: x\nversion: 0.3.0\nappVersion: 0.3.0\nkubeVersion: 1\n"
        );
        let lock = "version = 4\n\n[[package]]\nname = \"fuzz\"\nversion = \"0.0.0\"\n\n\
                [[package]]\nname = \"interceptor\"\nversion = \"0.2.0\"\n\n\
                [[package]]\nname = \"other\"\nversion = \"0.2.0\"\nsource = \"registry+x\"\n";
        assert_eq!(
            set_lock_versions(lock, &["interceptor".into()], &v("0.3.0")),
            lock.replacen(
                "name = \"interceptor\"\nversion = \"0.2.0\"",
                "name = \"interceptor\"\nversion = \"0.3.0\"",
                1
            )
        );
    }
}
