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
        err.to_string()
            .contains("CHANGELOG.md's newest entry (## Baseline 0.1.0 - 2026-11-27) is \"0.1.0\""),
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
