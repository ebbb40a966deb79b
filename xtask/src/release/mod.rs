//! `cargo xtask release`: one version for the crates, the chart and the image, checked against
//! CHANGELOG.md, whose entries record each release's commit (docs/releasing.md).
mod scheme;

use std::{fs, path::Path, process::Command};

use anyhow::{Context as _, bail, ensure};

use crate::{cmd, workspace_root};
use scheme::{Changelog, Commit, Kind, Version};

const CHANGELOG: &str = "CHANGELOG.md";
const CARGO_TOML: &str = "Cargo.toml";
const CARGO_LOCK: &str = "Cargo.lock";
const FUZZ_LOCK: &str = "fuzz/Cargo.lock";
const CHART: &str = "charts/interceptor/Chart.yaml";
/// What a cut writes, and all it commits.
const RELEASE_FILES: [&str; 5] = [CHANGELOG, CARGO_TOML, CARGO_LOCK, FUZZ_LOCK, CHART];

/// The tree's files, read once.
struct Files {
    changelog: String,
    cargo_toml: String,
    cargo_lock: String,
    fuzz_lock: String,
    chart: String,
}

impl Files {
    fn read(root: &Path) -> anyhow::Result<Self> {
        let read = |path: &str| {
            fs::read_to_string(root.join(path)).with_context(|| format!("read {path}"))
        };
        Ok(Self {
            changelog: read(CHANGELOG)?,
            cargo_toml: read(CARGO_TOML)?,
            cargo_lock: read(CARGO_LOCK)?,
            fuzz_lock: read(FUZZ_LOCK)?,
            chart: read(CHART)?,
        })
    }

    /// The workspace's packages, by the names its lock holds.
    fn workspace_packages(&self) -> Vec<String> {
        scheme::lock_versions(&self.cargo_lock, CARGO_LOCK)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }
}

/// What the files alone say: every version place agrees with the workspace's version and the
/// changelog's newest entry. Returns the parsed changelog for the git checks.
fn check_files(files: &Files) -> anyhow::Result<Changelog> {
    let workspace = scheme::workspace_version(&files.cargo_toml)?;
    Version::parse(&workspace.version).context(CARGO_TOML)?;
    let changelog = Changelog::parse(&files.changelog)?;
    let mut places = vec![scheme::changelog_place(changelog.latest()?)];
    places.extend(scheme::chart_versions(&files.chart)?);
    let packages = files.workspace_packages();
    places.extend(
        scheme::lock_versions(&files.cargo_lock, CARGO_LOCK)
            .into_iter()
            .chain(scheme::lock_versions(&files.fuzz_lock, FUZZ_LOCK))
            .filter(|(name, _)| packages.contains(name))
            .map(|(_, place)| place),
    );
    scheme::check_agree(&workspace, &places)?;
    Ok(changelog)
}

/// `cargo xtask release check`: the files agree, and what the changelog records is in this
/// clone's history.
pub fn check() -> anyhow::Result<()> {
    let root = workspace_root();
    let files = Files::read(root)?;
    let changelog = check_files(&files)?;
    let latest = changelog.latest()?;
    let Some(git) = Git::open(root)? else {
        println!(
            "release check: versions agree ({}); not a git clone, commits not checked",
            latest.version
        );
        return Ok(());
    };
    for (i, entry) in changelog.entries.iter().enumerate() {
        match &entry.commit {
            Commit::Hash(hash) => git.check_recorded(hash, &entry.heading)?,
            Commit::Pending => {
                debug_assert_eq!(i, 0, "the parser allows pending only in the newest entry");
                ensure!(
                    !git.parent_changelog_has(&entry.heading)?,
                    "CHANGELOG.md: {}'s commit is still \"pending\", but that entry is older than \
                     HEAD; write its release commit (the commit that added the entry) in its place",
                    entry.heading
                );
            }
        }
    }
    // The newest entry's tree against the work tree: a change beyond the changelog is news the
    // Unreleased section must carry.
    if let Commit::Hash(hash) = &latest.commit
        && changelog.unreleased.is_empty()
        && git.differs_beyond_changelog(hash)?
    {
        bail!(
            "CHANGELOG.md: {} is empty, but this tree differs from {} ({hash}) beyond \
             CHANGELOG.md: say what changed there (Added, Changed, Fixed, Upgrade notes)",
            scheme::UNRELEASED,
            latest.heading
        );
    }
    println!(
        "release check: versions agree ({} {}), the changelog's commits are in this clone's history",
        match latest.kind {
            Kind::Release => "release",
            Kind::Baseline => "baseline",
        },
        latest.version
    );
    Ok(())
}

/// The release before HEAD's, as the changelog records it: the upgrade test's starting point.
pub struct Previous {
    /// Its heading, e.g. `## [0.2.0] - 2026-12-01`.
    pub heading: String,
    pub version: String,
    /// Its full commit hash, in this clone's history.
    pub commit: String,
}

/// The newest changelog entry that is not HEAD's own release: skipped are a `pending` entry (HEAD
/// is the release commit) and one whose commit's tree is HEAD's but for CHANGELOG.md (HEAD
/// records it). Fails, saying how to get it, where the clone lacks its commit.
pub fn previous() -> anyhow::Result<Previous> {
    let root = workspace_root();
    let changelog = check_files(&Files::read(root)?)?;
    let git = Git::open(root)?.context(
        "the upgrade test builds the previous release from this repository's history: run it in \
         a git clone",
    )?;
    for entry in &changelog.entries {
        let Commit::Hash(hash) = &entry.commit else {
            continue;
        };
        git.check_recorded(hash, &entry.heading)?;
        if git.differs_beyond_changelog(hash)? {
            return Ok(Previous {
                heading: entry.heading.trim_start_matches('#').trim().to_owned(),
                version: entry.version.to_string(),
                commit: hash.clone(),
            });
        }
    }
    bail!(
        "CHANGELOG.md records no release before HEAD's: the upgrade test has nothing to start from"
    )
}

/// `cargo xtask release cut VERSION`: the release commit and the commit that records it.
pub fn cut(version: &str) -> anyhow::Result<()> {
    let version = Version::parse(version)?;
    let root = workspace_root();
    check().context("the tree must pass `cargo xtask release check` before a cut")?;
    let git = Git::open(root)?.context("a cut commits: run it in a git clone")?;
    git.ensure_clean(&RELEASE_FILES)?;
    let files = Files::read(root)?;
    let changelog = Changelog::parse(&files.changelog)?;
    let latest = changelog.latest()?;
    ensure!(
        version.is_after(&latest.version),
        "{version} does not come after {} ({}): pick a later version",
        latest.version,
        latest.heading
    );
    ensure!(
        !changelog.unreleased.is_empty(),
        "CHANGELOG.md: {} is empty: there is nothing to release",
        scheme::UNRELEASED
    );
    let date = cmd::output(Command::new("date").args(["-u", "+%F"]))?;
    let packages = files.workspace_packages();
    let write = |path: &str, text: String| {
        fs::write(root.join(path), text).with_context(|| format!("write {path}"))
    };
    write(
        CHANGELOG,
        scheme::cut_changelog(&files.changelog, &version, date.trim())?,
    )?;
    write(
        CARGO_TOML,
        scheme::set_workspace_version(&files.cargo_toml, &version)?,
    )?;
    write(
        CARGO_LOCK,
        scheme::set_lock_versions(&files.cargo_lock, &packages, &version),
    )?;
    write(
        FUZZ_LOCK,
        scheme::set_lock_versions(&files.fuzz_lock, &packages, &version),
    )?;
    write(CHART, scheme::set_chart_versions(&files.chart, &version))?;
    check_files(&Files::read(root)?).context("the cut's own edits do not agree")?;
    git.commit(&format!("Release {version}"), &RELEASE_FILES)?;
    let release = git.head()?;
    let recorded = scheme::record_commit(&fs::read_to_string(root.join(CHANGELOG))?, &release)?;
    write(CHANGELOG, recorded)?;
    git.commit(
        &format!("changelog: record {version}'s release commit"),
        &[CHANGELOG],
    )?;
    check()?;
    println!(
        "released {version} as {release}; tag it where tags can be pushed:\n  \
         git tag -a v{version} {release} -m 'interceptor {version}' && git push origin v{version}"
    );
    Ok(())
}

/// The git clone the workspace is in.
struct Git<'a> {
    root: &'a Path,
}

impl<'a> Git<'a> {
    /// `None` when the workspace is not a git work tree (an unpacked source archive).
    fn open(root: &'a Path) -> anyhow::Result<Option<Self>> {
        let git = Self { root };
        let inside = git
            .command(&["rev-parse", "--is-inside-work-tree"])
            .output();
        Ok(match inside {
            Ok(out) if out.status.success() => Some(git),
            _ => None,
        })
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = Command::new("git");
        command.current_dir(self.root).args(args);
        command
    }

    fn succeeds(&self, args: &[&str]) -> anyhow::Result<bool> {
        let out = self
            .command(args)
            .output()
            .with_context(|| format!("could not start `git {}`", args.join(" ")))?;
        Ok(out.status.success())
    }

    fn check_recorded(&self, hash: &str, heading: &str) -> anyhow::Result<()> {
        let present = || self.succeeds(&["cat-file", "-e", &format!("{hash}^{{commit}}")]);
        if !present()? {
            let shallow =
                cmd::output(&mut self.command(&["rev-parse", "--is-shallow-repository"]))?;
            // A CI clone is often shallow: its history is one fetch away.
            if shallow.trim() == "true" {
                println!(
                    "release check: {heading}'s commit is not in this shallow clone: git fetch --unshallow"
                );
                if self.succeeds(&["fetch", "--quiet", "--unshallow"])? && present()? {
                    return self.check_recorded(hash, heading);
                }
            }
            bail!(
                "CHANGELOG.md: {heading} records commit {hash}, which this clone does not have{}",
                if shallow.trim() == "true" {
                    ": the clone is shallow, and `git fetch --unshallow` did not bring it: fetch \
                     the history that holds it"
                } else {
                    ": fetch the history that holds it, or correct the entry"
                }
            );
        }
        ensure!(
            self.succeeds(&["merge-base", "--is-ancestor", hash, "HEAD"])?,
            "CHANGELOG.md: {heading} records commit {hash}, which is not in HEAD's history"
        );
        Ok(())
    }

    /// Whether HEAD's parent's changelog already holds `heading`: false for the release
    /// commit of a cut (and for a cut not yet committed).
    fn parent_changelog_has(&self, heading: &str) -> anyhow::Result<bool> {
        let out = self
            .command(&["show", &format!("HEAD^:{CHANGELOG}")])
            .output()
            .context("could not start `git show`")?;
        Ok(out.status.success()
            && String::from_utf8_lossy(&out.stdout)
                .lines()
                .any(|line| line == heading))
    }

    fn differs_beyond_changelog(&self, commit: &str) -> anyhow::Result<bool> {
        let exclude = format!(":(exclude){CHANGELOG}");
        Ok(!self.succeeds(&["diff", "--quiet", commit, "--", ".", &exclude])?)
    }

    fn ensure_clean(&self, paths: &[&str]) -> anyhow::Result<()> {
        let mut args = vec!["diff", "--quiet", "HEAD", "--"];
        args.extend(paths);
        ensure!(
            self.succeeds(&args)?,
            "{} have uncommitted changes: commit or stash them before a cut",
            paths.join(", ")
        );
        Ok(())
    }

    /// Commits `paths` alone, whatever else is staged (others work in the same tree).
    fn commit(&self, message: &str, paths: &[&str]) -> anyhow::Result<()> {
        let mut args = vec!["commit", "--quiet", "-m", message, "--"];
        args.extend(paths);
        cmd::run(&mut self.command(&args))
    }

    fn head(&self) -> anyhow::Result<String> {
        Ok(cmd::output(&mut self.command(&["rev-parse", "HEAD"]))?
            .trim()
            .to_owned())
    }
}

#[cfg(test)]
mod tests {
    /// `cargo test` catches a version out of step too, without git.
    #[test]
    fn this_tree_agrees() {
        super::check_files(&super::Files::read(crate::workspace_root()).unwrap())
            .unwrap_or_else(|e| panic!("{e:#}"));
    }
}
