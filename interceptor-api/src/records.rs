//! The pod records the node agent keeps on disk, one file per pod (`<netns cookie>.json`,
//! written atomically once the pod's interception is in force), and what a restarted agent
//! decides from them: which pods it takes back and how, which it forgets, and what it removes
//! from the maps for pods without a record. The reading of the files, the kernel's side and the
//! writing are the agent's (`interceptor`'s `agent::records` and `agent::restore`); the format
//! and the decisions are here, with no eBPF or Kubernetes dependency, so that the `pod_record`
//! fuzz target drives them.
//!
//! A record's backend part ([`MeshedBy`]) is the backend's own: which backend meshed the pod,
//! named here, and what that backend keeps of it (the iptables backend: the chains it wrote),
//! which it serializes and reads itself, opaque here.
use std::{collections::BTreeSet, path::PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer, de::DeserializeOwned};

use crate::{Backend, ConfigError, InterceptionConfig, NetnsCookie, PodMeta};
use interceptor_config::user_ids::HostIds;

/// What the agent keeps of one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRecord {
    pub netns: PathBuf,
    pub netns_cookie: NetnsCookie,
    pub meta: PodMeta,
    pub config: InterceptionConfig,
    /// The configuration's proxy ids as the host knows them, translated through the pod's user
    /// namespace at registration. `None`: an older agent's record, translated again at restore.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_ids: Option<HostIds>,
    /// Which backend meshed the pod, with its part of the record.
    #[serde(rename = "backend")]
    pub meshed_by: MeshedBy,
}

/// What the agent keeps with each pod in the node's pod table: the rest of a record (its key,
/// namespace path and configuration) is the entry's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub meta: PodMeta,
    /// Which backend meshed the pod, with its part of the record.
    pub meshed_by: MeshedBy,
}

impl PodRecord {
    pub fn new(
        netns_cookie: NetnsCookie,
        netns: PathBuf,
        config: InterceptionConfig,
        host_ids: HostIds,
        facts: PodFacts,
    ) -> Self {
        Self {
            netns,
            netns_cookie,
            meta: facts.meta,
            config,
            host_ids: Some(host_ids),
            meshed_by: facts.meshed_by,
        }
    }

    pub fn facts(&self) -> PodFacts {
        PodFacts {
            meta: self.meta.clone(),
            meshed_by: self.meshed_by.clone(),
        }
    }
}

/// Which backend meshed a pod, and that backend's own part of its record (`part`: the fields
/// its part serializes to, written and read by the backend alone). On disk it is one object,
/// `{"kind": "iptables", "mode": "nft", "rules": [...]}`; a record of an agent that predates the
/// choice has none, and is eBPF's, whose part is empty (the maps and pins are read back).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MeshedBy {
    pub kind: Backend,
    pub part: serde_json::Map<String, serde_json::Value>,
}

impl MeshedBy {
    /// Meshed by `kind`, which keeps nothing in the record.
    pub fn new(kind: Backend) -> Self {
        Self {
            kind,
            part: serde_json::Map::new(),
        }
    }

    /// Meshed by `kind`, which keeps `part`; it must serialize to an object without a `kind`.
    pub fn with_part(kind: Backend, part: &impl Serialize) -> Result<Self, serde_json::Error> {
        use serde::ser::Error as _;
        match serde_json::to_value(part)? {
            serde_json::Value::Object(part) if !part.contains_key("kind") => {
                Ok(Self { kind, part })
            }
            _ => Err(serde_json::Error::custom(
                "a backend's part of a record is an object without a `kind`",
            )),
        }
    }

    /// The backend's part, read as `T` (by the backend that wrote it).
    pub fn part<T: DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(serde_json::Value::Object(self.part.clone()))
    }
}

impl Serialize for MeshedBy {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap as _;
        let mut map = serializer.serialize_map(Some(1 + self.part.len()))?;
        map.serialize_entry("kind", &self.kind)?;
        for (key, value) in &self.part {
            map.serialize_entry(key, value)?;
        }
        map.end()
    }
}

impl<'de> Deserialize<'de> for MeshedBy {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error as _;
        let mut part = serde_json::Map::deserialize(deserializer)?;
        let kind = part
            .remove("kind")
            .ok_or_else(|| D::Error::missing_field("kind"))?;
        let kind = Backend::deserialize(kind).map_err(D::Error::custom)?;
        Ok(Self { kind, part })
    }
}

/// A record as read: `config`, or proxy-init's flags (`args`) from an older agent.
#[derive(Deserialize)]
struct Stored {
    netns: PathBuf,
    netns_cookie: NetnsCookie,
    #[serde(default)]
    meta: PodMeta,
    #[serde(default)]
    config: Option<InterceptionConfig>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    host_ids: Option<HostIds>,
    #[serde(default)]
    backend: MeshedBy,
}

/// Why a record file cannot be used; the agent reports it and skips the file.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("not a pod record: {0}")]
    Json(#[from] serde_json::Error),
    #[error("its proxy-init flags (an older agent's record): {0}")]
    Flags(#[from] ConfigError),
    #[error("its file name is not <netns cookie>.json")]
    FileName,
    /// The agent finds, rewrites and removes a pod's record by its cookie: one under another
    /// name is not where the agent looks for that pod's, and would be a second record of it.
    #[error("it is the record of pod {content}, not of pod {file} as its file name says")]
    NotItsFile {
        file: NetnsCookie,
        content: NetnsCookie,
    },
}

/// A record read back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadBack {
    pub record: PodRecord,
    /// Written by an older agent with proxy-init's flags: the agent writes it again as
    /// configuration ([`to_json`]).
    pub older: bool,
}

/// The file name of a pod's record.
pub fn file_name(cookie: NetnsCookie) -> String {
    format!("{cookie}.json")
}

/// The pod whose record a file name is, if it is one.
pub fn cookie_of(file_name: &str) -> Option<NetnsCookie> {
    let digits = file_name.strip_suffix(".json")?;
    // Only what [`file_name`] writes: no sign, no leading zero.
    if digits.is_empty()
        || !digits.bytes().all(|b| b.is_ascii_digit())
        || (digits.len() > 1 && digits.starts_with('0'))
    {
        return None;
    }
    digits.parse().ok().map(NetnsCookie)
}

/// A record file's content (`bytes`), read back from the file `name`: JSON with `config`, or an
/// older agent's with proxy-init's flags (`args`), whose configuration is read as the agent
/// reads flags. The file must be the pod's own ([`file_name`]).
pub fn parse(name: &str, bytes: &[u8]) -> Result<ReadBack, RecordError> {
    let file = cookie_of(name).ok_or(RecordError::FileName)?;
    let stored: Stored = serde_json::from_slice(bytes)?;
    if stored.netns_cookie != file {
        return Err(RecordError::NotItsFile {
            file,
            content: stored.netns_cookie,
        });
    }
    let older = stored.config.is_none();
    let config = crate::config_or_flags(stored.config.as_ref(), &stored.args)?;
    Ok(ReadBack {
        record: PodRecord {
            netns: stored.netns,
            netns_cookie: stored.netns_cookie,
            meta: stored.meta,
            config,
            host_ids: stored.host_ids,
            meshed_by: stored.backend,
        },
        older,
    })
}

/// A record's file content, as the agent writes it.
pub fn to_json(record: &PodRecord) -> serde_json::Result<Vec<u8>> {
    serde_json::to_vec_pretty(record)
}

/// What a restarted agent found of a record's pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Its network namespace opened, with this key (its netns cookie).
    Key(NetnsCookie),
    /// Its network namespace opened, with this key, but what it delivers over lo could not be
    /// read (a netlink dump failed, and why): the namespace is there, so the pod is taken back
    /// as with [`Found::Key`], with the local destinations in force before the restart.
    Unread { key: NetnsCookie, why: String },
    /// Its network namespace is not there (or not one), and why.
    Gone(String),
}

/// How a record's pod is taken back, by an agent of any backend: from what its own backend
/// recorded, or from another backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore<'a> {
    /// The agent's backend meshed it: its part of the record (the iptables backend: the chains
    /// in force, kept unless they changed; eBPF: nothing, the maps and pins are read back).
    Own(&'a MeshedBy),
    /// Another backend meshed it: the agent's backend takes it over (eBPF removes the pod's
    /// chains once its programs are attached; iptables writes its chains and leaves the pinned
    /// eBPF state alone).
    From(Backend),
}

/// Why a record's pod was not restored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NotRestored {
    /// Its namespace is gone or was replaced, or its record is unusable: the pod is gone.
    Gone(String),
    /// The backend refused it; nothing of it is in force.
    Refused(String),
    /// It stays as the previous agent left it, and so does its record: the pod is reported
    /// (a record without a registered pod) and tried again at the next start.
    Kept(String),
}

/// What the agent does about a pod it did not restore.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Then {
    /// Stops the start-up: building new maps (a map layout migration), a pod they cannot take
    /// would lose its interception at the switch. Nothing was switched yet.
    Abort(String),
    /// Leaves the pod and its record as they are.
    Keep(String),
    /// Removes what the maps and pins hold of it, and its record.
    Forget(String),
}

impl NotRestored {
    /// Why a pod whose namespace is there but could not be read ([`Found::Unread`]) was not
    /// restored: a refusal of the backend keeps it and its record (it is tried again at the next
    /// start) rather than forgetting it, as nothing says its namespace is gone; `migrating`, it
    /// still stops the start-up, as the new maps would not have it.
    pub fn unread(self, why_unread: &str, migrating: bool) -> Self {
        match self {
            Self::Refused(why) if !migrating => Self::Kept(format!(
                "{why}; its network namespace is there but could not be read: {why_unread}"
            )),
            other => other,
        }
    }

    /// What becomes of the pod; `migrating`: the maps being filled are new ones the links do
    /// not use yet.
    pub fn then(self, migrating: bool) -> Then {
        match self {
            Self::Refused(why) if migrating => Then::Abort(why),
            Self::Kept(why) => Then::Keep(why),
            Self::Gone(why) | Self::Refused(why) => Then::Forget(why),
        }
    }
}

/// How an agent whose backend is `agent` takes back a record's pod, given what it `found` of its
/// namespace; or why it does not (its namespace is gone or was replaced by another). A
/// namespace that is there is never taken for gone, whatever could not be read in it.
pub fn restore_step(
    record: &PodRecord,
    agent: Backend,
    found: Found,
) -> Result<Restore<'_>, NotRestored> {
    match found {
        Found::Gone(why) => return Err(NotRestored::Gone(why)),
        Found::Key(key) | Found::Unread { key, .. } if key != record.netns_cookie => {
            return Err(NotRestored::Gone(
                "its network namespace was replaced".into(),
            ));
        }
        Found::Key(_) | Found::Unread { .. } => {}
    }
    Ok(if record.meshed_by.kind == agent {
        Restore::Own(&record.meshed_by)
    } else {
        Restore::From(record.meshed_by.kind)
    })
}

/// What a restarted agent does with one record's pod: how it takes it back given what it
/// `found` of its namespace ([`restore_step`]), then `apply` (the backend's work), and what
/// becomes of a pod not restored ([`NotRestored::then`]), as `Agent::restore` does for each
/// record. A pod whose namespace is there but could not be read ([`Found::Unread`]) is never
/// forgotten for the backend's refusal ([`NotRestored::unread`]).
pub fn take_back<'a, T>(
    record: &'a PodRecord,
    agent: Backend,
    found: Found,
    migrating: bool,
    apply: impl FnOnce(Restore<'a>) -> Result<T, NotRestored>,
) -> Result<T, Then> {
    let unread = match &found {
        Found::Unread { why, .. } => Some(why.clone()),
        Found::Key(_) | Found::Gone(_) => None,
    };
    restore_step(record, agent, found)
        .and_then(|how| {
            apply(how).map_err(|not| match &unread {
                Some(why) => not.unread(why, migrating),
                None => not,
            })
        })
        .map_err(|not| not.then(migrating))
}

/// What the maps or the pins hold (`in_maps`) of pods with neither a registration nor a record,
/// once the records are restored: their leftovers are removed. A pod left as it was
/// ([`Then::Keep`]) has a record and is not registered: what the maps hold of it keeps it
/// intercepted, and stays.
pub fn leftovers_after_restore(
    in_maps: impl IntoIterator<Item = NetnsCookie>,
    registered: impl Fn(NetnsCookie) -> bool,
    recorded: &BTreeSet<NetnsCookie>,
) -> BTreeSet<NetnsCookie> {
    leftovers(in_maps, |cookie| {
        registered(cookie) || recorded.contains(&cookie)
    })
}

/// The pods the maps or the pins hold something of (`in_maps`) that are not registered: a
/// registration or a removal cut short. Their leftovers are removed.
pub fn leftovers(
    in_maps: impl IntoIterator<Item = NetnsCookie>,
    registered: impl Fn(NetnsCookie) -> bool,
) -> BTreeSet<NetnsCookie> {
    in_maps
        .into_iter()
        .filter(|cookie| !registered(*cookie))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    type Record = PodRecord;

    fn read(name: &str, json: &str) -> Result<ReadBack, RecordError> {
        parse(name, json.as_bytes())
    }

    #[test]
    fn an_older_record_of_flags_reads_as_configuration_and_is_marked_for_rewriting() {
        let back = read(
            "42.json",
            r#"{"netns":"/run/netns/p","netns_cookie":42,"meta":{"name":"web"},
           "args":["-p","4143","-o","4140","-u","2102","--outbound-ports-to-ignore","25"]}"#,
        )
        .unwrap();
        assert!(back.older);
        assert_eq!(back.record.meta.name.as_deref(), Some("web"));
        assert_eq!(
            back.record.config.outbound_ports_to_ignore.to_string(),
            "25"
        );
        assert_eq!(
            back.record.meshed_by,
            MeshedBy::new(Backend::Ebpf),
            "an older record is eBPF's"
        );
        // Written again, it has the configuration and no flags, and reads back the same.
        let json = to_json(&back.record).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert!(value.get("args").is_none(), "{value}");
        assert_eq!(value["config"]["outbound_ports_to_ignore"], "25");
        let again: ReadBack = parse("42.json", &json).unwrap();
        assert!(!again.older);
        assert_eq!(again.record, back.record);
    }

    #[test]
    fn a_backends_part_of_a_record_is_kept_as_written() {
        let json = r#"{"netns":"/p","netns_cookie":7,"meta":{},
        "config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140},
        "backend":{"kind":"iptables","mode":"nft","rules":["ipv4 -A X"]}}"#;
        let back = read("7.json", json).unwrap();
        assert!(!back.older);
        assert_eq!(back.record.meshed_by.kind, Backend::Iptables);
        let part: serde_json::Value = back.record.meshed_by.part().unwrap();
        assert_eq!(
            part,
            serde_json::json!({"mode": "nft", "rules": ["ipv4 -A X"]})
        );
        // Written again, byte for byte the same object: what an agent of the release before reads.
        let value: serde_json::Value =
            serde_json::from_slice(&to_json(&back.record).unwrap()).unwrap();
        assert_eq!(
            value["backend"],
            serde_json::json!({"kind": "iptables", "mode": "nft", "rules": ["ipv4 -A X"]})
        );
        assert_eq!(
            serde_json::to_value(MeshedBy::new(Backend::Ebpf)).unwrap(),
            serde_json::json!({"kind": "ebpf"})
        );
        // A part must be an object of its own fields.
        assert!(MeshedBy::with_part(Backend::Iptables, &serde_json::json!({"kind": "x"})).is_err());
        assert!(MeshedBy::with_part(Backend::Iptables, &7).is_err());
        assert!(read("7.json", &json.replace(r#""kind":"iptables","#, "")).is_err());
    }

    #[test]
    fn a_records_host_ids_are_kept_and_an_older_record_has_none() {
        let mut with_ids = record(9, MeshedBy::new(Backend::Ebpf));
        with_ids.host_ids = Some(HostIds {
            proxy_uid: Some(202102),
            proxy_gid: None,
        });
        let json = to_json(&with_ids).unwrap();
        let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(value["host_ids"], serde_json::json!({"proxy_uid": 202102}));
        assert_eq!(
            read("9.json", std::str::from_utf8(&json).unwrap())
                .unwrap()
                .record,
            with_ids
        );
        let older = r#"{"netns":"/p","netns_cookie":9,"meta":{},
        "config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140,"proxy_uid":2102}}"#;
        assert_eq!(read("9.json", older).unwrap().record.host_ids, None);
    }

    #[test]
    fn unusable_records_say_why() {
        let flags = read(
            "43.json",
            r#"{"netns":"/p","netns_cookie":43,"args":["-p","0"]}"#,
        );
        assert!(matches!(flags, Err(RecordError::Flags(_))), "{flags:?}");
        assert!(matches!(read("43.json", "{"), Err(RecordError::Json(_))));
        let ok = r#"{"netns":"/p","netns_cookie":43,"args":[]}"#;
        for name in [
            "43",
            "x.json",
            "043.json",
            "+43.json",
            ".json",
            "43.json.tmp",
        ] {
            assert!(
                matches!(read(name, ok), Err(RecordError::FileName)),
                "{name}"
            );
        }
        let e = read("44.json", ok).unwrap_err();
        assert_eq!(
            e.to_string(),
            "it is the record of pod 43, not of pod 44 as its file name says"
        );
        assert_eq!(
            cookie_of(&file_name(NetnsCookie(u64::MAX))),
            Some(NetnsCookie(u64::MAX))
        );
        assert_eq!(cookie_of("0.json"), Some(NetnsCookie(0)));
    }

    fn record(cookie: u64, meshed_by: MeshedBy) -> Record {
        Record {
            netns: "/p".into(),
            netns_cookie: NetnsCookie(cookie),
            meta: PodMeta::default(),
            config: InterceptionConfig::linkerd(),
            host_ids: None,
            meshed_by,
        }
    }

    #[test]
    fn a_pod_is_restored_by_either_backend_while_its_namespace_is_the_same() {
        let ebpf = record(1, MeshedBy::new(Backend::Ebpf));
        let chains = serde_json::json!({"mode": "legacy", "rules": []});
        let iptables = record(2, MeshedBy::with_part(Backend::Iptables, &chains).unwrap());
        let key = |r: &Record| Found::Key(r.netns_cookie);
        assert_eq!(
            restore_step(&ebpf, Backend::Ebpf, key(&ebpf)),
            Ok(Restore::Own(&ebpf.meshed_by))
        );
        assert_eq!(
            restore_step(&iptables, Backend::Ebpf, key(&iptables)),
            Ok(Restore::From(Backend::Iptables))
        );
        assert_eq!(
            restore_step(&ebpf, Backend::Iptables, key(&ebpf)),
            Ok(Restore::From(Backend::Ebpf))
        );
        assert_eq!(
            restore_step(&iptables, Backend::Iptables, key(&iptables)),
            Ok(Restore::Own(&iptables.meshed_by))
        );
        assert_eq!(
            restore_step(&ebpf, Backend::Ebpf, Found::Key(NetnsCookie(9))),
            Err(NotRestored::Gone(
                "its network namespace was replaced".into()
            ))
        );
        assert_eq!(
            restore_step(&ebpf, Backend::Iptables, Found::Gone("no such file".into())),
            Err(NotRestored::Gone("no such file".into()))
        );
    }

    /// Issue 47: a netlink dump that failed in a namespace that is there made the pod pass for gone,
    /// and a restart purged a live pod's entries and deleted its record. Such a pod is restored by
    /// either backend, and a refusal keeps it; only a replaced namespace is forgotten.
    #[test]
    fn a_pod_whose_namespace_is_there_but_unread_is_restored_never_forgotten() {
        let ebpf = record(1, MeshedBy::new(Backend::Ebpf));
        let chains = serde_json::json!({"mode": "legacy", "rules": []});
        let iptables = record(2, MeshedBy::with_part(Backend::Iptables, &chains).unwrap());
        let unread = |key| Found::Unread {
            key: NetnsCookie(key),
            why: "RTM_GETROUTE: No buffer space available".into(),
        };
        assert_eq!(
            restore_step(&ebpf, Backend::Ebpf, unread(1)),
            Ok(Restore::Own(&ebpf.meshed_by))
        );
        assert_eq!(
            restore_step(&iptables, Backend::Iptables, unread(2)),
            Ok(Restore::Own(&iptables.meshed_by))
        );
        assert_eq!(
            restore_step(&ebpf, Backend::Ebpf, unread(9)),
            Err(NotRestored::Gone(
                "its network namespace was replaced".into()
            ))
        );
        let refused = || NotRestored::Refused("the maps are full".into());
        let kept = refused().unread("ENOBUFS", false);
        assert!(
            matches!(kept.clone().then(false), Then::Keep(why) if why.contains("ENOBUFS")),
            "{kept:?}"
        );
        // New maps without the pod would unmesh it at the switch.
        assert!(matches!(
            refused().unread("ENOBUFS", true).then(true),
            Then::Abort(_)
        ));
        let gone = NotRestored::Gone("its network namespace was replaced".into());
        assert_eq!(gone.clone().unread("ENOBUFS", false), gone);
    }

    #[test]
    fn a_pod_not_restored_is_forgotten_kept_or_stops_a_migration() {
        let why = || "x".to_owned();
        assert_eq!(NotRestored::Refused(why()).then(true), Then::Abort(why()));
        assert_eq!(NotRestored::Refused(why()).then(false), Then::Forget(why()));
        for migrating in [false, true] {
            assert_eq!(
                NotRestored::Gone(why()).then(migrating),
                Then::Forget(why())
            );
            assert_eq!(NotRestored::Kept(why()).then(migrating), Then::Keep(why()));
        }
        let registered = [NetnsCookie(1), NetnsCookie(3)];
        assert_eq!(
            leftovers([1, 2, 3, 2, 4].map(NetnsCookie), |c| registered
                .contains(&c)),
            BTreeSet::from([NetnsCookie(2), NetnsCookie(4)])
        );
    }

    /// Found by the `pod_record` fuzz target: two files holding the record of one pod (4098.json
    /// saying pod 4097). Both were read; the one whose namespace is gone made the agent purge pod
    /// 4097 from the maps and delete 4097.json, right after restoring it from the other: a live
    /// pod lost its interception and its record. A record is now read only from its own file.
    #[test]
    fn a_second_record_of_a_pod_under_another_file_name_is_not_read() {
        let record = |path: &str| {
            format!(
                r#"{{"netns":"{path}","netns_cookie":4097,"config":{{"incoming_proxy_port":4143,"outgoing_proxy_port":4140}}}}"#
            )
        };
        let own = read("4097.json", &record("/var/run/netns/cni-1")).unwrap();
        assert_eq!(own.record.netns_cookie, NetnsCookie(4097));
        let other = read("4098.json", &record("/var/run/netns/cni-gone"));
        assert!(
            matches!(
                other,
                Err(RecordError::NotItsFile {
                    file: NetnsCookie(4098),
                    content: NetnsCookie(4097)
                })
            ),
            "{other:?}"
        );
    }

    /// `take_back`, as `Agent::restore` calls it: the backend's refusal of a pod whose namespace is
    /// there but unread keeps the pod; of one read, forgets it; a gone pod never reaches the backend;
    /// what the maps hold of a kept pod (a record, no registration) is no leftover.
    #[test]
    fn take_back_keeps_an_unread_pod_the_backend_refuses() {
        let ebpf = record(1, MeshedBy::new(Backend::Ebpf));
        let refuse = |_: Restore<'_>| -> Result<(), NotRestored> {
            Err(NotRestored::Refused("the maps are full".into()))
        };
        let unread = Found::Unread {
            key: NetnsCookie(1),
            why: "RTM_GETADDR: No buffer space available".into(),
        };
        assert!(matches!(
            take_back(&ebpf, Backend::Ebpf, unread.clone(), false, refuse),
            Err(Then::Keep(why)) if why.contains("RTM_GETADDR")
        ));
        assert!(matches!(
            take_back(&ebpf, Backend::Ebpf, unread, true, refuse),
            Err(Then::Abort(_))
        ));
        assert!(matches!(
            take_back(
                &ebpf,
                Backend::Ebpf,
                Found::Key(NetnsCookie(1)),
                false,
                refuse
            ),
            Err(Then::Forget(_))
        ));
        let gone = Found::Gone("no such file".into());
        assert!(matches!(
            take_back(
                &ebpf,
                Backend::Ebpf,
                gone,
                false,
                |_| -> Result<(), NotRestored> { panic!("a gone pod reaches the backend") }
            ),
            Err(Then::Forget(_))
        ));
        assert_eq!(
            take_back(
                &ebpf,
                Backend::Ebpf,
                Found::Key(NetnsCookie(1)),
                false,
                |how| {
                    assert_eq!(how, Restore::Own(&ebpf.meshed_by));
                    Ok(7)
                }
            ),
            Ok(7)
        );
        let recorded = BTreeSet::from([NetnsCookie(1)]);
        let left = leftovers_after_restore(
            [NetnsCookie(1), NetnsCookie(2), NetnsCookie(3)],
            |c| c == NetnsCookie(3),
            &recorded,
        );
        assert_eq!(left, BTreeSet::from([NetnsCookie(2)]));
    }
}
