//! A restarted agent's pod records: each file as it reads it back (`interceptor_api::records`:
//! JSON with `config`, or an older agent's proxy-init flags, which it rewrites), then what it
//! decides from the set against what the maps hold: which pods it takes back and how (by
//! either backend, bringing a pod over from the other one), which it forgets, keeps, or for
//! which it stops a map migration, and which cookies in the maps are leftovers to remove. The
//! kernel's side (opening the namespace, reading it, registering in the maps, writing chains)
//! is simulated by the input; the decisions are the agent's own functions (`take_back` and
//! `leftovers_after_restore`, which `Agent::restore` calls for each record).
//!
//! Input (UTF-8): option lines (`iptables`: the agent's backend; `migrating`: filling new maps;
//! `maps=1,2`: the cookies the maps and pins hold something of), then files, each a line
//! `--- <file name> [found=<cookie>|found=gone|found=unread|found=unread:<cookie>]
//! [outcome=ok|refused|kept]` (by default the namespace is still there with the recorded cookie
//! and the backend takes the pod; `unread`: the namespace is there, with the recorded cookie or
//! the one given, but a netlink dump of it failed) and the file's content up to the next such
//! line.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use interceptor_api::{
    Backend, InterceptionConfig, NetnsCookie,
    records::{
        self, Found, NotRestored, PodRecord, Restore, Then, leftovers_after_restore, take_back,
    },
};
use libfuzzer_sys::fuzz_target;
use serde::{Deserialize, Serialize};

/// The agent's `ChainsInForce` (its iptables backend's part of a record), in its JSON form.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Chains {
    mode: Mode,
    rules: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Mode {
    Legacy,
    Nft,
    Plain,
}

/// What the agent finds of one record's pod's namespace, as the input says.
#[derive(Clone)]
enum Namespace {
    /// There, with this key, read (or not).
    There {
        key: Option<NetnsCookie>,
        read: bool,
    },
    Gone,
}

/// What the kernel makes of one record's pod, as the input says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Refused,
    Kept,
}

struct File {
    content: String,
    namespace: Namespace,
    outcome: Outcome,
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut agent = Backend::Ebpf;
    let mut migrating = false;
    let mut in_maps = Vec::new();
    // A directory holds one file of a name: the last one given.
    let mut files: BTreeMap<&str, File> = BTreeMap::new();
    let mut current: Option<&str> = None;
    for line in text.split_inclusive('\n') {
        if let Some(header) = line.strip_prefix("--- ") {
            let mut words = header.split_whitespace();
            let name = words.next().unwrap_or_default();
            let mut file = File {
                content: String::new(),
                namespace: Namespace::There {
                    key: None,
                    read: true,
                },
                outcome: Outcome::Ok,
            };
            for word in words {
                match word.split_once('=') {
                    Some(("found", "gone")) => file.namespace = Namespace::Gone,
                    Some(("found", found)) => {
                        let (read, key) = match found.strip_prefix("unread") {
                            Some(key) => (false, key.strip_prefix(':').unwrap_or(key)),
                            None => (true, found),
                        };
                        let key = key.parse().ok().map(NetnsCookie);
                        file.namespace = Namespace::There { key, read };
                    }
                    Some(("outcome", "refused")) => file.outcome = Outcome::Refused,
                    Some(("outcome", "kept")) => file.outcome = Outcome::Kept,
                    _ => {}
                }
            }
            files.insert(name, file);
            current = Some(name);
        } else if let Some(name) = current {
            files
                .get_mut(name)
                .expect("the current file")
                .content
                .push_str(line);
        } else {
            match line.trim() {
                "iptables" => agent = Backend::Iptables,
                "migrating" => migrating = true,
                option => {
                    if let Some(cookies) = option.strip_prefix("maps=") {
                        in_maps.extend(
                            cookies
                                .split(',')
                                .filter_map(|c| c.parse().ok())
                                .map(NetnsCookie),
                        );
                    }
                }
            }
        }
    }

    // Reading back, as `Records::load_all`: unreadable files are skipped.
    let mut loaded: Vec<(PodRecord, &File)> = Vec::new();
    for (name, file) in &files {
        match records::parse(name, file.content.as_bytes()) {
            Ok(back) => {
                let record = back.record;
                assert_eq!(
                    records::cookie_of(name),
                    Some(record.netns_cookie),
                    "a record is read from its own file"
                );
                check_config(&record.config);
                // What the agent writes (a rewrite of an older one too) reads back the same.
                let json = records::to_json(&record).expect("a record serializes");
                let again = records::parse(name, &json)
                    .unwrap_or_else(|e| panic!("a written record reads back: {e}"));
                assert!(!again.older, "a written record has its configuration");
                assert_eq!(again.record, record, "a written record reads back the same");
                let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
                assert!(value.get("args").is_none(), "a written record has no flags");
                loaded.push((record, file));
            }
            Err(e) => assert!(!e.to_string().is_empty(), "a refusal says why"),
        }
    }
    loaded.sort_by_key(|(r, _)| r.netns_cookie);
    let cookies: BTreeSet<NetnsCookie> = loaded.iter().map(|(r, _)| r.netns_cookie).collect();
    assert_eq!(cookies.len(), loaded.len(), "one record per pod");

    // Restoring, as `Agent::restore`.
    let mut registered = BTreeSet::new();
    let mut forgotten = BTreeSet::new();
    for (record, file) in &loaded {
        let cookie = record.netns_cookie;
        let found = match &file.namespace {
            Namespace::Gone => Found::Gone("no such file".into()),
            Namespace::There { key, read: true } => Found::Key(key.unwrap_or(cookie)),
            Namespace::There { key, read: false } => Found::Unread {
                key: key.unwrap_or(cookie),
                why: "RTM_GETROUTE: No buffer space available".into(),
            },
        };
        let its_own = match &found {
            Found::Key(key) | Found::Unread { key, .. } => *key == cookie,
            Found::Gone(_) => false,
        };
        let unread = matches!(found, Found::Unread { .. });
        let mut applied = false;
        let result = take_back(record, agent, found, migrating, |how| {
            applied = true;
            match how {
                Restore::Own(part) => {
                    assert_eq!(record.meshed_by.kind, agent);
                    assert_eq!(part, &record.meshed_by, "the part compared is the one recorded");
                    // The iptables backend reads its chains from it, or writes them anew.
                    if agent == Backend::Iptables
                        && let Ok(chains) = part.part::<Chains>()
                    {
                        let again = records::MeshedBy::with_part(agent, &chains).unwrap();
                        assert_eq!(again.part::<Chains>().unwrap(), chains);
                    }
                }
                Restore::From(other) => {
                    assert_ne!(other, agent, "taken over from another backend");
                    assert_eq!(other, record.meshed_by.kind);
                }
            }
            match (agent, file.outcome) {
                (_, Outcome::Ok) => Ok(()),
                // The maps refuse a pod; writing chains that fail keeps it as it was.
                (Backend::Ebpf, _) => Err(NotRestored::Refused("the maps are full".into())),
                (Backend::Iptables, _) => Err(NotRestored::Kept("iptables failed".into())),
            }
        });
        assert_eq!(
            applied, its_own,
            "only a pod whose namespace is its own is taken back"
        );
        match result {
            Ok(()) => {
                registered.insert(cookie);
            }
            Err(Then::Abort(why)) => {
                assert!(migrating && its_own && agent == Backend::Ebpf);
                assert_ne!(file.outcome, Outcome::Ok);
                assert!(!why.is_empty());
                // The start-up stops: nothing is switched, nothing removed.
                return;
            }
            Err(Then::Keep(why)) => {
                assert!(its_own, "only a pod whose namespace is there is kept");
                assert!(!why.is_empty(), "a kept pod says why");
            }
            Err(Then::Forget(why)) => {
                assert!(!why.is_empty(), "a forgotten pod says why");
                // A namespace that is there but could not be read never passes for gone,
                // whatever the backend makes of the pod.
                assert!(
                    !(its_own && unread),
                    "a pod whose namespace is there is not forgotten: {why}"
                );
                assert!(
                    !its_own || (agent == Backend::Ebpf && file.outcome != Outcome::Ok),
                    "a pod whose namespace is its own is forgotten only when the maps refuse it"
                );
                forgotten.insert(cookie);
            }
        }
    }
    assert!(registered.is_disjoint(&forgotten));
    // Records left: those of pods not forgotten.
    let recorded: BTreeSet<NetnsCookie> = cookies.difference(&forgotten).copied().collect();
    let left = leftovers_after_restore(
        in_maps.iter().copied(),
        |c| registered.contains(&c),
        &recorded,
    );
    for cookie in &in_maps {
        assert_eq!(
            left.contains(cookie),
            !recorded.contains(cookie) && !registered.contains(cookie),
            "what the maps hold of a pod with a record stays; of one without, goes"
        );
    }
    assert!(left.iter().all(|c| in_maps.contains(c)));
});

/// A record's configuration is valid: it survives its JSON form and proxy-init's flags.
fn check_config(config: &InterceptionConfig) {
    let json = serde_json::to_string(config).expect("a configuration serializes");
    let back: InterceptionConfig = serde_json::from_str(&json)
        .unwrap_or_else(|e| panic!("{json} of a record's configuration: {e}"));
    assert_eq!(&back, config);
    let flags = config.to_args();
    let again = InterceptionConfig::from_proxy_init_args(&flags)
        .unwrap_or_else(|e| panic!("{flags:?} of a record's configuration: {e}"));
    assert_eq!(&again, config);
}
