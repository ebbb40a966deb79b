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

/// The record format and its reading are `interceptor_api::records`' (what the `pod_record`
/// fuzz target drives); each backend writes and reads its own part of a record (`MeshedBy`,
/// see `AgentBackend::meshed_by`). `PodFacts` is what the agent keeps with each pod in its
/// backend's table.
pub use super::api::records::{MeshedBy, PodFacts, PodRecord};

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
        self.dir.join(super::api::records::file_name(cookie))
    }

    /// Writes a pod's record; the error names the file (the records directory read-only or
    /// full is the node's problem, which the message must point at). A record that could not be
    /// written leaves nothing behind, not even its temp file.
    pub fn save(&self, record: &PodRecord) -> io::Result<()> {
        let path = self.path(record.netns_cookie);
        let tmp = path.with_extension("json.tmp");
        let json = super::api::records::to_json(record).map_err(io::Error::other)?;
        let written = match crate::crash_points::fault_error!("pod-record-write-fails") {
            Some(e) => Err(e),
            None => fs::write(&tmp, json),
        }
        .and_then(|()| fs::rename(&tmp, &path));
        written.map_err(|e| {
            let _ = fs::remove_file(&tmp);
            io::Error::new(e.kind(), format!("writing {}: {e}", path.display()))
        })
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
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let back = super::api::records::parse(name, &fs::read(path)?).map_err(io::Error::other)?;
        if back.older {
            self.save(&back.record)?;
            tracing::info!(path = %path.display(), "rewrote a pod record of an older agent (flags) as JSON configuration");
        }
        Ok(back.record)
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
            loaded[0].meshed_by,
            MeshedBy::new(crate::agent::api::Backend::Ebpf),
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
        // Another file holding pod 42's record is not read: restoring pod 42 from one and
        // forgetting it (a purge, its record deleted) for the other would unmesh it (found by
        // the `pod_record` fuzz target).
        fs::write(
            dir.join("44.json"),
            r#"{"netns":"/gone","netns_cookie":42,"config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140}}"#,
        )
        .unwrap();
        assert_eq!(records.load_all(), loaded, "only 42.json is pod 42's");
        fs::remove_dir_all(&dir).unwrap();
    }
}
