//! The pods a node meshes: one table of them, whichever backend intercepts them.
//!
//! An entry is one pod: the key its backend knows it by (the netns cookie, see
//! [`Interception::key`]), the namespace path it was registered with, its configuration, what
//! it delivers over lo, its user's facts (the agent's: names and which backend meshed it;
//! nothing for `interceptor run`) and what the backend wrote for it. A backend keeps nothing per
//! pod of its own: the table hands each call the entry it is about, and changes the entry only
//! once the backend has put the change in force. The agent's record of a pod is built from its
//! entry.
//!
//! The backends implement [`Interception`]: the eBPF programs in `ebpf/` (`EbpfNode`) and
//! proxy-init's chains in `iptables/` (`IptablesBackend`). What only one of them can do (the
//! eBPF maps' counters, listeners and pins) is an inherent method of its table,
//! `PodTable<EbpfNode, F>`, written beside that backend.
use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use interceptor_common::NetnsCookie;

use crate::{
    config::{InterceptionConfig, user_ids::HostIds},
    netns::{LocalDestinations, NetnsError, PodNetns},
};

/// A backend: how a pod's interception is put in force, changed, checked and taken away.
pub trait Interception {
    /// What the backend wrote for one pod, kept in its entry: enough to change it, check it
    /// and remove it exactly (eBPF: its counter slot, subnet entries and sk_lookup link;
    /// iptables: the chains `iptables-save` listed once they were written).
    type Written;
    type Error: std::error::Error + Send + Sync + 'static;
    /// What a check or a restore of many pods reads once rather than once per pod (eBPF: the
    /// subnet entries of every pod; iptables: nothing).
    type Census;

    /// The key this backend knows a pod by: its netns cookie, which the eBPF programs read in
    /// the kernel (Linux 5.14); iptables falls back to [`PodNetns::inode_key`] before that.
    /// Needs no backend (no lock on it): it switches into the namespace.
    fn key(netns: &PodNetns) -> Result<NetnsCookie, NetnsError>;

    /// [`Self::key`] and what the pod delivers over lo, with one switch into its namespace.
    fn identify(netns: &PodNetns) -> Result<(NetnsCookie, LocalDestinations), NetnsError>;

    /// [`Self::identify`], with why the local destinations could not be read rather than
    /// failing: a failed dump alone must not pass for a gone namespace.
    fn identify_lenient(
        netns: &PodNetns,
    ) -> Result<(NetnsCookie, Result<LocalDestinations, NetnsError>), NetnsError> {
        match Self::identify(netns) {
            Ok((key, local)) => Ok((key, Ok(local))),
            Err(e) => Self::key(netns).map(|key| (key, Err(e))),
        }
    }

    /// Refuses a new pod when the backend serves as many as it can (`meshed` are served).
    fn room(&self, meshed: usize) -> Result<(), Self::Error>;

    /// Puts `wanted` in force for the pod `key`: a new pod, or a change to `before`. On failure
    /// what `before` describes stays in force, and `before` is as it was.
    fn write(
        &mut self,
        key: NetnsCookie,
        wanted: &Wanted<'_>,
        before: Option<&mut Pod<Self::Written>>,
    ) -> Result<Self::Written, Self::Error>;

    /// Makes `local` what the pod delivers over lo, its configuration kept; on failure `pod`
    /// is as it was.
    fn set_local(
        &mut self,
        key: NetnsCookie,
        pod: &mut Pod<Self::Written>,
        local: &LocalDestinations,
    ) -> Result<(), Self::Error>;

    /// Takes the pod out of interception. On failure it stays intercepted, as `pod` says.
    fn remove(&mut self, key: NetnsCookie, pod: &mut Pod<Self::Written>)
    -> Result<(), Self::Error>;

    /// Lets go of a pod whose namespace is gone or was replaced: what lived in it went with it.
    fn forget(&mut self, key: NetnsCookie, pod: &mut Pod<Self::Written>)
    -> Result<(), Self::Error>;

    /// Why what is in force for the pod is not what was written, as far as can be told cheaply.
    fn problem(&self, key: NetnsCookie, pod: &Pod<Self::Written>) -> Option<String>;

    /// What a thorough check or a restore of many pods reads once.
    fn census(&self) -> Self::Census;

    /// The thorough check of one pod: what differs between what was written for it and what is
    /// in force. Without a census, only what needs none is checked.
    fn differs(
        &self,
        key: NetnsCookie,
        pod: &Pod<Self::Written>,
        census: Option<&Self::Census>,
    ) -> Option<String>;

    /// Takes back a pod an earlier process meshed (its state outlives the process): what it
    /// wrote is kept where it is still `wanted`'s, repaired or written again where not.
    /// `recorded`: what the pod's record says was written, where the backend records it.
    fn adopt(
        &mut self,
        key: NetnsCookie,
        wanted: &Wanted<'_>,
        recorded: Option<&Self::Written>,
        census: &mut Self::Census,
    ) -> Result<Adopted<Self::Written>, Self::Error>;
}

/// A pod's state as it is to be put in force.
pub struct Wanted<'a> {
    /// Its namespace, opened once by whoever identified the pod.
    pub netns: &'a PodNetns,
    pub config: &'a InterceptionConfig,
    /// The configuration's proxy UID and GID as the host's kernel knows them, translated
    /// through the pod's user namespace when it has its own (`PodNetns::users`).
    pub host_ids: HostIds,
    pub local: &'a LocalDestinations,
}

/// A pod as the table holds it, without its user's facts: what its backend is handed.
#[derive(Debug)]
pub struct Pod<W> {
    /// The namespace path it was registered with (how a runtime names it each time).
    pub netns: PathBuf,
    /// The configuration asked for (what its record keeps).
    pub config: InterceptionConfig,
    /// Its proxy ids as the host knows them (see [`Wanted::host_ids`]).
    pub host_ids: HostIds,
    /// Its addresses and `local` routes, as written.
    pub local: LocalDestinations,
    pub written: W,
}

/// One pod of the table.
#[derive(Debug)]
pub struct PodEntry<W, F> {
    pub pod: Pod<W>,
    /// What the table's user keeps with the pod.
    pub facts: F,
}

/// A pod taken back by [`Interception::adopt`].
pub struct Adopted<W> {
    pub written: W,
    /// What the pod delivers over lo as it is in force (the wanted one, unless what was in
    /// force had to be kept).
    pub local: LocalDestinations,
    /// What was repaired, or why what was in force is kept.
    pub repaired: Option<String>,
}

/// The pods one node meshes, by key, and the backend that intercepts them.
pub struct PodTable<B: Interception, F = ()> {
    /// Before the backend: the pods' own attachments go before what they all share.
    pods: BTreeMap<NetnsCookie, PodEntry<B::Written, F>>,
    backend: B,
}

impl<B: Interception, F> PodTable<B, F> {
    pub fn new(backend: B) -> Self {
        Self {
            pods: BTreeMap::new(),
            backend,
        }
    }

    pub fn backend(&self) -> &B {
        &self.backend
    }

    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn is_empty(&self) -> bool {
        self.pods.is_empty()
    }

    pub fn contains(&self, key: NetnsCookie) -> bool {
        self.pods.contains_key(&key)
    }

    pub fn get(&self, key: NetnsCookie) -> Option<&PodEntry<B::Written, F>> {
        self.pods.get(&key)
    }

    /// The pods, by key.
    pub fn iter(&self) -> impl Iterator<Item = (NetnsCookie, &PodEntry<B::Written, F>)> {
        self.pods.iter().map(|(key, entry)| (*key, entry))
    }

    pub fn keys(&self) -> Vec<NetnsCookie> {
        self.pods.keys().copied().collect()
    }

    /// The pod registered for the namespace at `netns`. Compared as bytes, not as `Path`s
    /// (which parses both into components): a runtime names a pod's namespace the same way
    /// each time, and parsing was a tenth of a registration's time at 1,000 pods.
    pub fn find(&self, netns: &Path) -> Option<NetnsCookie> {
        self.iter()
            .find(|(_, entry)| entry.pod.netns.as_os_str() == netns.as_os_str())
            .map(|(key, _)| key)
    }

    pub fn facts_mut(&mut self, key: NetnsCookie) -> Option<&mut F> {
        Some(&mut self.pods.get_mut(&key)?.facts)
    }

    /// Replaces what is kept with a pod, writing nothing; returns what was kept (`None`: the
    /// pod is not in the table).
    pub fn set_facts(&mut self, key: NetnsCookie, facts: F) -> Option<F> {
        Some(std::mem::replace(
            &mut self.pods.get_mut(&key)?.facts,
            facts,
        ))
    }

    /// Puts `wanted` in force for the pod `key` (registered at `path`), new or changed, and
    /// keeps `facts` with it. On failure what was in force stays, and so does the entry.
    pub fn write(
        &mut self,
        key: NetnsCookie,
        path: &Path,
        wanted: &Wanted<'_>,
        facts: F,
    ) -> Result<(), B::Error> {
        if !self.pods.contains_key(&key) {
            self.backend.room(self.pods.len())?;
        }
        let before = self.pods.get_mut(&key);
        let written = self
            .backend
            .write(key, wanted, before.map(|entry| &mut entry.pod))?;
        let pod = Pod {
            netns: path.to_owned(),
            config: wanted.config.clone(),
            host_ids: wanted.host_ids,
            local: wanted.local.clone(),
            written,
        };
        self.pods.insert(key, PodEntry { pod, facts });
        Ok(())
    }

    /// Makes `local` what a registered pod delivers over lo.
    pub fn set_local(
        &mut self,
        key: NetnsCookie,
        local: &LocalDestinations,
    ) -> Result<(), B::Error> {
        let Some(entry) = self.pods.get_mut(&key) else {
            return Ok(());
        };
        self.backend.set_local(key, &mut entry.pod, local)?;
        entry.pod.local = local.clone();
        Ok(())
    }

    /// Takes a pod out of interception, and out of the table; on failure it stays. Returns
    /// its entry.
    pub fn remove(
        &mut self,
        key: NetnsCookie,
    ) -> Result<Option<PodEntry<B::Written, F>>, B::Error> {
        let Some(entry) = self.pods.get_mut(&key) else {
            return Ok(None);
        };
        self.backend.remove(key, &mut entry.pod)?;
        Ok(self.pods.remove(&key))
    }

    /// Lets go of a pod whose namespace is gone or was replaced; if that fails, it stays (to
    /// be tried again).
    pub fn forget(
        &mut self,
        key: NetnsCookie,
    ) -> Result<Option<PodEntry<B::Written, F>>, B::Error> {
        let Some(entry) = self.pods.get_mut(&key) else {
            return Ok(None);
        };
        self.backend.forget(key, &mut entry.pod)?;
        Ok(self.pods.remove(&key))
    }

    /// See [`Interception::problem`].
    pub fn problem(&self, key: NetnsCookie) -> Option<String> {
        self.backend.problem(key, &self.pods.get(&key)?.pod)
    }

    pub fn census(&self) -> B::Census {
        self.backend.census()
    }

    /// See [`Interception::differs`].
    pub fn differs(&self, key: NetnsCookie, census: Option<&B::Census>) -> Option<String> {
        self.backend.differs(key, &self.pods.get(&key)?.pod, census)
    }

    /// Takes back a pod an earlier process meshed (see [`Interception::adopt`]) and keeps
    /// `facts` with it. Returns what was repaired, or why what was in force is kept.
    pub fn adopt(
        &mut self,
        key: NetnsCookie,
        path: &Path,
        wanted: &Wanted<'_>,
        recorded: Option<&B::Written>,
        census: &mut B::Census,
        facts: F,
    ) -> Result<Option<String>, B::Error> {
        let adopted = self.backend.adopt(key, wanted, recorded, census)?;
        let pod = Pod {
            netns: path.to_owned(),
            config: wanted.config.clone(),
            host_ids: wanted.host_ids,
            local: adopted.local,
            written: adopted.written,
        };
        self.pods.insert(key, PodEntry { pod, facts });
        Ok(adopted.repaired)
    }
}

#[cfg(test)]
mod tests {
    //! The table's side of the contract, with a backend that fails when told to: an entry changes
    //! only once its backend has put the change in force, and a new pod is refused up front when
    //! the backend has no room. (Each real backend is held to its side by the kernel tests.)
    use std::path::Path;

    use interceptor_common::NetnsCookie;

    use super::*;

    /// Writes nothing; counts what it was asked, and fails the next call when `fail` is set.
    #[derive(Default)]
    struct Fake {
        fail: bool,
        max: usize,
        writes: u32,
    }

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;

    impl Fake {
        fn outcome(&mut self) -> Result<(), Refused> {
            if std::mem::take(&mut self.fail) {
                return Err(Refused);
            }
            Ok(())
        }
    }

    impl Interception for Fake {
        /// Which write of the backend's wrote the pod.
        type Written = u32;
        type Error = Refused;
        type Census = ();

        fn key(_netns: &PodNetns) -> Result<NetnsCookie, NetnsError> {
            Ok(NetnsCookie(1))
        }

        fn identify(netns: &PodNetns) -> Result<(NetnsCookie, LocalDestinations), NetnsError> {
            Ok((Self::key(netns)?, LocalDestinations::default()))
        }

        fn room(&self, meshed: usize) -> Result<(), Refused> {
            if meshed >= self.max {
                return Err(Refused);
            }
            Ok(())
        }

        fn write(
            &mut self,
            _key: NetnsCookie,
            _wanted: &Wanted<'_>,
            _before: Option<&mut Pod<u32>>,
        ) -> Result<u32, Refused> {
            self.outcome()?;
            self.writes += 1;
            Ok(self.writes)
        }

        fn set_local(
            &mut self,
            _key: NetnsCookie,
            _pod: &mut Pod<u32>,
            _local: &LocalDestinations,
        ) -> Result<(), Refused> {
            self.outcome()
        }

        fn remove(&mut self, _key: NetnsCookie, _pod: &mut Pod<u32>) -> Result<(), Refused> {
            self.outcome()
        }

        fn forget(&mut self, _key: NetnsCookie, _pod: &mut Pod<u32>) -> Result<(), Refused> {
            self.outcome()
        }

        fn problem(&self, _key: NetnsCookie, _pod: &Pod<u32>) -> Option<String> {
            None
        }

        fn census(&self) {}

        fn differs(
            &self,
            _key: NetnsCookie,
            _pod: &Pod<u32>,
            _census: Option<&()>,
        ) -> Option<String> {
            None
        }

        fn adopt(
            &mut self,
            key: NetnsCookie,
            wanted: &Wanted<'_>,
            recorded: Option<&u32>,
            _census: &mut (),
        ) -> Result<Adopted<u32>, Refused> {
            Ok(Adopted {
                written: match recorded {
                    Some(recorded) => *recorded,
                    None => self.write(key, wanted, None)?,
                },
                local: wanted.local.clone(),
                repaired: recorded.is_none().then(|| "written again".to_owned()),
            })
        }
    }

    fn config(inbound: u16) -> InterceptionConfig {
        InterceptionConfig {
            incoming_proxy_port: inbound,
            ..InterceptionConfig::linkerd()
        }
    }

    #[test]
    fn an_entry_changes_only_once_its_backend_has_put_the_change_in_force() {
        let netns = PodNetns::open(Path::new("/proc/self/ns/net")).unwrap();
        let local = LocalDestinations::default();
        let (first, second) = (config(4143), config(4000));
        let wanted = |config| Wanted {
            netns: &netns,
            config,
            host_ids: HostIds::of_host_pod(config),
            local: &local,
        };
        let key = NetnsCookie(7);
        let mut pods: PodTable<Fake, &str> = PodTable::new(Fake {
            max: 1,
            ..Fake::default()
        });

        pods.backend_mut().fail = true;
        assert!(
            pods.write(key, Path::new("/a"), &wanted(&first), "web")
                .is_err()
        );
        assert!(pods.is_empty(), "a refused new pod is not in the table");

        pods.write(key, Path::new("/a"), &wanted(&first), "web")
            .unwrap();
        pods.backend_mut().fail = true;
        assert!(
            pods.write(key, Path::new("/b"), &wanted(&second), "api")
                .is_err()
        );
        let entry = pods.get(key).unwrap();
        assert_eq!(
            (
                entry.pod.config.incoming_proxy_port,
                entry.pod.written,
                entry.facts
            ),
            (4143, 1, "web"),
            "a refused change leaves the entry as it was"
        );
        assert_eq!(pods.find(Path::new("/a")), Some(key));

        pods.write(key, Path::new("/a"), &wanted(&second), "api")
            .unwrap();
        let entry = pods.get(key).unwrap();
        assert_eq!(
            (
                entry.pod.config.incoming_proxy_port,
                entry.pod.written,
                entry.facts
            ),
            (4000, 2, "api")
        );

        // Full: a new pod is refused before the backend writes anything; a change is not.
        assert!(
            pods.write(NetnsCookie(8), Path::new("/c"), &wanted(&first), "db")
                .is_err()
        );
        assert_eq!(pods.backend().writes, 2);
        pods.write(key, Path::new("/a"), &wanted(&first), "web")
            .unwrap();

        pods.backend_mut().fail = true;
        assert!(pods.remove(key).is_err());
        assert!(pods.contains(key), "a pod whose removal failed stays");
        pods.backend_mut().fail = true;
        assert!(pods.forget(key).is_err());
        assert!(pods.contains(key));
        assert_eq!(pods.remove(key).unwrap().map(|e| e.facts), Some("web"));
        assert!(
            pods.remove(key).unwrap().is_none(),
            "removing twice is no error"
        );

        let repaired = pods
            .adopt(
                key,
                Path::new("/a"),
                &wanted(&first),
                Some(&1),
                &mut (),
                "web",
            )
            .unwrap();
        assert_eq!(repaired, None);
        assert_eq!(
            pods.get(key).unwrap().pod.written,
            1,
            "what was recorded is kept"
        );
    }
}
