//! An instance's on-disk state: a lock held for its lifetime, a JSON description of what is
//! attached, and its pinned maps, so `interceptor status` can report from another process.
//!
//! - `/run/interceptor/<instance>/lock`: flock held by the running process; a lock that can be
//!   taken means the instance is gone (even after a crash).
//! - `/run/interceptor/<instance>/state.json`: [`InstanceState`].
//! - `/sys/fs/bpf/interceptor/<instance>/`: pinned maps (on a bpffs, mounted if needed).
use interceptor_common::{NetnsCookie, PodSlot};
use std::{
    fs::{self, File, OpenOptions},
    io,
    path::{Path, PathBuf},
};

use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};

use crate::{config::InterceptionConfig, ebpf::ProgramState};

pub const RUN_ROOT: &str = "/run/interceptor";
pub use crate::bpffs::{BPFFS_ROOT, ensure_bpffs};

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error(
        "instance {instance:?} is already running (pid {pid}): stop it, or pass another --instance"
    )]
    Busy { instance: String, pid: String },
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("instance name {0:?} is not valid: use letters, digits, '-' and '_'")]
    BadName(String),
    #[error(transparent)]
    Bpffs(#[from] crate::bpffs::BpffsError),
}

fn io_error<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StateError + 'a {
    move |source| StateError::Io {
        action,
        path: path.to_owned(),
        source,
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct PodState {
    pub netns: PathBuf,
    pub netns_cookie: NetnsCookie,
    pub slot: PodSlot,
    pub addresses: Vec<String>,
    pub config: InterceptionConfig,
    /// The pod's own sk_lookup program (which tail-calls the shared one), attached to its network
    /// namespace.
    pub sk_lookup: Option<ProgramState>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct InstanceState {
    pub instance: String,
    pub pid: u32,
    /// Where this run's maps and links are pinned.
    pub pin_dir: PathBuf,
    pub backend: String,
    pub cgroup: PathBuf,
    pub started_at_unix: u64,
    pub programs: Vec<ProgramState>,
    pub pods: Vec<PodState>,
}

/// Where an instance keeps its state.
#[derive(Clone, Debug)]
pub struct InstancePaths {
    pub name: String,
    pub run_dir: PathBuf,
    pub pin_dir: PathBuf,
}

impl InstancePaths {
    pub fn new(name: &str) -> Result<Self, StateError> {
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(StateError::BadName(name.to_owned()));
        }
        Ok(Self {
            name: name.to_owned(),
            run_dir: Path::new(RUN_ROOT).join(name),
            pin_dir: Path::new(BPFFS_ROOT).join("interceptor").join(name),
        })
    }

    pub fn state_file(&self) -> PathBuf {
        self.run_dir.join("state.json")
    }

    fn lock_file(&self) -> PathBuf {
        self.run_dir.join("lock")
    }

    /// Every instance with a state directory, running or stale.
    pub fn all() -> Vec<Self> {
        let Ok(entries) = fs::read_dir(RUN_ROOT) else {
            return Vec::new();
        };
        // An instance's directory holds its lock; the agent's files share the root.
        let mut names: Vec<String> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().join("lock").is_file())
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        names.sort();
        names.iter().filter_map(|n| Self::new(n).ok()).collect()
    }

    pub fn read_state(&self) -> Option<InstanceState> {
        serde_json::from_slice(&fs::read(self.state_file()).ok()?).ok()
    }

    /// True while the process that owns the instance holds its lock.
    pub fn is_running(&self) -> bool {
        let Ok(file) = File::open(self.lock_file()) else {
            return false;
        };
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(_released_on_drop) => false,
            Err(_) => true,
        }
    }
}

/// Held by the process that owns an instance; removes the instance's state when dropped.
pub struct InstanceLock {
    paths: InstancePaths,
    _lock: Flock<File>,
}

impl InstanceLock {
    /// Takes the instance, clearing what a crashed owner left behind.
    pub fn acquire(paths: InstancePaths) -> Result<Self, StateError> {
        fs::create_dir_all(&paths.run_dir).map_err(io_error("creating", &paths.run_dir))?;
        let lock_path = paths.lock_file();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock_path)
            .map_err(io_error("opening", &lock_path))?;
        let lock =
            Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|_| StateError::Busy {
                instance: paths.name.clone(),
                pid: paths
                    .read_state()
                    .map_or("unknown".into(), |s| s.pid.to_string()),
            })?;
        // A previous run that died left its programs attached and pinned (fail closed); they
        // stay until this run has attached its own (`take_over`).
        let _ = fs::remove_file(paths.state_file());
        ensure_bpffs(Path::new(BPFFS_ROOT))?;
        fs::create_dir_all(&paths.pin_dir).map_err(io_error("creating", &paths.pin_dir))?;
        Ok(Self { paths, _lock: lock })
    }

    pub fn paths(&self) -> &InstancePaths {
        &self.paths
    }

    /// This process's pin directory: maps and links of one run ("generation") of the instance.
    pub fn generation_dir(&self) -> PathBuf {
        self.paths.pin_dir.join(std::process::id().to_string())
    }

    /// Detaches and unpins what earlier runs of the instance that died left attached; called once
    /// this run's programs are attached, so there is no moment without interception. Returns
    /// the generations removed.
    pub fn take_over(&self) -> Vec<PathBuf> {
        let own = self.generation_dir();
        let Ok(entries) = fs::read_dir(&self.paths.pin_dir) else {
            return Vec::new();
        };
        let stale: Vec<PathBuf> = entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| *p != own)
            .collect();
        for dir in &stale {
            crate::bpffs::remove_pins(dir);
        }
        stale
    }

    pub fn write_state(&self, state: &InstanceState) -> Result<(), StateError> {
        let path = self.paths.state_file();
        let tmp = path.with_extension("json.tmp");
        let json = serde_json::to_vec_pretty(state).expect("state serializes");
        fs::write(&tmp, json).map_err(io_error("writing", &tmp))?;
        fs::rename(&tmp, &path).map_err(io_error("renaming", &path))
    }
}

impl Drop for InstanceLock {
    fn drop(&mut self) {
        // The node removed its own pins when it detached; only an empty directory is left.
        let _ = fs::remove_dir(&self.paths.pin_dir);
        let _ = fs::remove_file(self.paths.state_file());
        let _ = fs::remove_file(self.paths.lock_file());
        let _ = fs::remove_dir(&self.paths.run_dir);
    }
}
