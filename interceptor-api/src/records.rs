//! The pod records the node agent keeps on disk, one file per pod (`<netns cookie>.json`,
//! written atomically once the pod's interception is in force), and what a restarted agent
//! decides from them: which pods it takes back and how, which it forgets, and what it removes
//! from the maps for pods without a record. The reading of the files, the kernel's side and the
//! writing are the agent's (`interceptor`'s `agent::records` and `agent::restore`); the format
//! and the decisions are here, with no eBPF or Kubernetes dependency, so that the `pod_record`
//! fuzz target drives them.
//!
//! A record's backend part is `C`: what the iptables backend wrote in the pod (the agent's
//! `ChainsInForce`), opaque here.
use std::{collections::BTreeSet, path::PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use crate::{Backend, ConfigError, InterceptionConfig, NetnsCookie, PodMeta};
use interceptor_config::user_ids::HostIds;

/// What the agent keeps of one pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRecord<C> {
    pub netns: PathBuf,
    pub netns_cookie: NetnsCookie,
    pub meta: PodMeta,
    pub config: InterceptionConfig,
    /// The configuration's proxy ids as the host knows them, translated through the pod's user
    /// namespace at registration. `None`: an older agent's record, translated again at restore.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_ids: Option<HostIds>,
    /// Which backend meshed the pod.
    pub backend: PodBackend<C>,
}

/// What the agent keeps with each pod in the node's pod table: the rest of a record (its key,
/// namespace path and configuration) is the entry's own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts<C> {
    pub meta: PodMeta,
    /// Which backend meshed the pod.
    pub meshed_by: PodBackend<C>,
}

impl<C: Clone> PodRecord<C> {
    pub fn new(
        netns_cookie: NetnsCookie,
        netns: PathBuf,
        config: InterceptionConfig,
        host_ids: HostIds,
        facts: PodFacts<C>,
    ) -> Self {
        Self {
            netns,
            netns_cookie,
            meta: facts.meta,
            config,
            host_ids: Some(host_ids),
            backend: facts.meshed_by,
        }
    }

    pub fn facts(&self) -> PodFacts<C> {
        PodFacts {
            meta: self.meta.clone(),
            meshed_by: self.backend.clone(),
        }
    }
}

/// Which backend meshed a pod, and for iptables what it wrote (`C`). Records of agents that
/// predate the choice are eBPF.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PodBackend<C> {
    #[default]
    Ebpf,
    Iptables(C),
}

impl<C> PodBackend<C> {
    pub fn kind(&self) -> Backend {
        match self {
            Self::Ebpf => Backend::Ebpf,
            Self::Iptables(_) => Backend::Iptables,
        }
    }
}

/// A record as read: `config`, or proxy-init's flags (`args`) from an older agent.
#[derive(Deserialize)]
#[serde(bound = "C: DeserializeOwned")]
struct Stored<C> {
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
    backend: PodBackend<C>,
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
pub struct ReadBack<C> {
    pub record: PodRecord<C>,
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
pub fn parse<C: DeserializeOwned>(name: &str, bytes: &[u8]) -> Result<ReadBack<C>, RecordError> {
    let file = cookie_of(name).ok_or(RecordError::FileName)?;
    let stored: Stored<C> = serde_json::from_slice(bytes)?;
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
            backend: stored.backend,
        },
        older,
    })
}

/// A record's file content, as the agent writes it.
pub fn to_json<C: Serialize>(record: &PodRecord<C>) -> serde_json::Result<Vec<u8>> {
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

/// How a record's pod is taken back, by an agent of either backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Restore<'a, C> {
    /// Registered in the eBPF maps (its slot and counters kept). `take_over`: the iptables
    /// backend meshed it; its chains are removed once the programs are attached.
    Ebpf { take_over: bool },
    /// Its iptables chains written, unless those `recorded` are in force. Without a record of
    /// them (eBPF meshed it) they are written, and its pinned eBPF state is left alone.
    Iptables { recorded: Option<&'a C> },
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
pub fn restore_step<C>(
    record: &PodRecord<C>,
    agent: Backend,
    found: Found,
) -> Result<Restore<'_, C>, NotRestored> {
    match found {
        Found::Gone(why) => return Err(NotRestored::Gone(why)),
        Found::Key(key) | Found::Unread { key, .. } if key != record.netns_cookie => {
            return Err(NotRestored::Gone(
                "its network namespace was replaced".into(),
            ));
        }
        Found::Key(_) | Found::Unread { .. } => {}
    }
    Ok(match agent {
        Backend::Ebpf => Restore::Ebpf {
            take_over: record.backend.kind() == Backend::Iptables,
        },
        Backend::Iptables => Restore::Iptables {
            recorded: match &record.backend {
                PodBackend::Iptables(chains) => Some(chains),
                PodBackend::Ebpf => None,
            },
        },
    })
}

/// What a restarted agent does with one record's pod: how it takes it back given what it
/// `found` of its namespace ([`restore_step`]), then `apply` (the backend's work), and what
/// becomes of a pod not restored ([`NotRestored::then`]), as `Agent::restore` does for each
/// record. A pod whose namespace is there but could not be read ([`Found::Unread`]) is never
/// forgotten for the backend's refusal ([`NotRestored::unread`]).
pub fn take_back<'a, C, T>(
    record: &'a PodRecord<C>,
    agent: Backend,
    found: Found,
    migrating: bool,
    apply: impl FnOnce(Restore<'a, C>) -> Result<T, NotRestored>,
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
#[path = "records_tests.rs"]
mod tests;
