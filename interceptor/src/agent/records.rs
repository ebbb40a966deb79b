//! What the agent keeps on disk about each pod, beside the kernel's maps: the pod's network
//! namespace path, its display names and its configuration (JSON). Written atomically (temp
//! file, rename) once the pod's map entries are in force, so a restarted agent restores exactly
//! what the maps took. Records of agents that kept proxy-init's flags instead are read once
//! and rewritten.
use interceptor_common::NetnsCookie;
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::{
    api::{Backend, PodMeta},
    iptables_pods::ChainsInForce,
};
use crate::config::InterceptionConfig;

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PodRecord {
    pub netns: PathBuf,
    pub netns_cookie: NetnsCookie,
    pub meta: PodMeta,
    pub config: InterceptionConfig,
    /// Which backend meshed the pod.
    pub backend: PodBackend,
}

/// What the agent keeps with each pod in its backend's table, which is the one table of the
/// agent's pods: the rest of a record (its key and configuration) is the backend's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub netns: PathBuf,
    pub meta: PodMeta,
    /// Which backend meshed the pod.
    pub meshed_by: PodBackend,
}

impl PodRecord {
    pub fn new(netns_cookie: NetnsCookie, config: InterceptionConfig, facts: PodFacts) -> Self {
        Self {
            netns: facts.netns,
            netns_cookie,
            meta: facts.meta,
            config,
            backend: facts.meshed_by,
        }
    }

    pub fn facts(&self) -> PodFacts {
        PodFacts {
            netns: self.netns.clone(),
            meta: self.meta.clone(),
            meshed_by: self.backend.clone(),
        }
    }
}

/// Which backend meshed a pod, and for iptables what it wrote. Records of agents that predate
/// the choice are eBPF.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum PodBackend {
    #[default]
    Ebpf,
    Iptables(ChainsInForce),
}

impl PodBackend {
    pub fn kind(&self) -> Backend {
        match self {
            Self::Ebpf => Backend::Ebpf,
            Self::Iptables(_) => Backend::Iptables,
        }
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
    backend: PodBackend,
}

pub struct Records {
    dir: PathBuf,
}

impl Records {
    pub fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
        })
    }

    fn path(&self, cookie: NetnsCookie) -> PathBuf {
        self.dir.join(format!("{cookie}.json"))
    }

    pub fn save(&self, record: &PodRecord) -> io::Result<()> {
        let path = self.path(record.netns_cookie);
        let tmp = path.with_extension("json.tmp");
        fs::write(
            &tmp,
            serde_json::to_vec_pretty(record).map_err(io::Error::other)?,
        )?;
        fs::rename(&tmp, &path)
    }

    /// Whether the pod has a record.
    pub fn exists(&self, cookie: NetnsCookie) -> bool {
        self.path(cookie).exists()
    }

    pub fn remove(&self, cookie: NetnsCookie) -> io::Result<()> {
        match fs::remove_file(self.path(cookie)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record; unreadable ones are reported and skipped, older ones rewritten.
    pub fn load_all(&self) -> Vec<PodRecord> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records: Vec<PodRecord> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| match self.read(&p) {
                Ok(record) => Some(record),
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "skipping an unreadable pod record");
                    None
                }
            })
            .collect();
        records.sort_by_key(|r| r.netns_cookie);
        records
    }

    fn read(&self, path: &Path) -> io::Result<PodRecord> {
        let stored: Stored = serde_json::from_slice(&fs::read(path)?).map_err(io::Error::other)?;
        let (config, older) = match stored.config {
            Some(config) => (config, false),
            None => (
                InterceptionConfig::from_proxy_init_args(&stored.args).map_err(io::Error::other)?,
                true,
            ),
        };
        let record = PodRecord {
            netns: stored.netns,
            netns_cookie: stored.netns_cookie,
            meta: stored.meta,
            config,
            backend: stored.backend,
        };
        if older {
            self.save(&record)?;
            tracing::info!(path = %path.display(), "rewrote a pod record of an older agent (flags) as JSON configuration");
        }
        Ok(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_of_flags_is_read_once_and_rewritten_as_configuration() {
        let dir = std::env::temp_dir().join(format!("icpt-records-{}", std::process::id()));
        let records = Records::open(&dir).unwrap();
        fs::write(
            dir.join("42.json"),
            r#"{"netns":"/run/netns/p","netns_cookie":42,"meta":{"name":"web"},
               "args":["-p","4143","-o","4140","-u","2102","--outbound-ports-to-ignore","25"]}"#,
        )
        .unwrap();
        let loaded = records.load_all();
        assert_eq!(loaded.len(), 1);
        assert_eq!(loaded[0].meta.name.as_deref(), Some("web"));
        assert_eq!(loaded[0].config.outbound_ports_to_ignore.to_string(), "25");
        assert_eq!(loaded[0].config.proxy_uid, Some(2102));
        assert_eq!(
            loaded[0].backend,
            PodBackend::Ebpf,
            "an older record is eBPF's"
        );
        let rewritten: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join("42.json")).unwrap()).unwrap();
        assert!(rewritten.get("args").is_none(), "{rewritten}");
        assert_eq!(rewritten["config"]["outbound_ports_to_ignore"], "25");
        assert_eq!(records.load_all(), loaded, "read back the same");

        fs::write(
            dir.join("43.json"),
            r#"{"netns":"/p","netns_cookie":43,"args":["-p","0"]}"#,
        )
        .unwrap();
        assert_eq!(
            records.load_all().len(),
            1,
            "an unreadable record is skipped"
        );
        fs::remove_dir_all(&dir).unwrap();
    }
}
