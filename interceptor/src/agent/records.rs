//! What the agent keeps on disk about each pod, beside the kernel's maps: the pod's network
//! namespace path, its display names and its flags. Written (atomically: temp file, rename)
//! before the pod's map entries, so a restarted agent finds every pod whose registration may
//! have reached the kernel, and checks it against the maps.
use std::{
    fs, io,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use super::api::PodMeta;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub netns: PathBuf,
    pub netns_cookie: u64,
    pub meta: PodMeta,
    pub args: Vec<String>,
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

    fn path(&self, cookie: u64) -> PathBuf {
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

    pub fn remove(&self, cookie: u64) -> io::Result<()> {
        match fs::remove_file(self.path(cookie)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Every record; unreadable ones are reported and skipped.
    pub fn load_all(&self) -> Vec<PodRecord> {
        let Ok(entries) = fs::read_dir(&self.dir) else {
            return Vec::new();
        };
        let mut records: Vec<PodRecord> = entries
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .filter_map(|p| match fs::read(&p).map(|b| serde_json::from_slice(&b)) {
                Ok(Ok(record)) => Some(record),
                Ok(Err(e)) => {
                    tracing::warn!(path = %p.display(), error = %e, "skipping an unreadable pod record");
                    None
                }
                Err(e) => {
                    tracing::warn!(path = %p.display(), error = %e, "skipping an unreadable pod record");
                    None
                }
            })
            .collect();
        records.sort_by_key(|r| r.netns_cookie);
        records
    }
}
