//! Whose ids a pod's processes have: the host's, or those of a user namespace of the pod's own
//! (Kubernetes' `hostUsers: false`), which owns its network namespace.
use std::os::fd::AsFd as _;

use super::{NetnsError, PodNetns};
use crate::config::user_ids::{IdMap, PodUsers};

impl PodNetns {
    /// How the user namespace that owns this network namespace maps ids to ours: [`PodUsers::Host`]
    /// when it is ours (one ioctl and two `stat`s), else its maps, read through a child that
    /// joins it (a fork: only for pods with a user namespace of their own).
    pub fn users(&self) -> Result<PodUsers, NetnsError> {
        let error = |call, e: std::io::Error| NetnsError::Syscall {
            call,
            path: self.path().to_owned(),
            source: nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        };
        let userns = interceptor_sys::userns::owning_user_namespace(self.file().as_fd())
            .map_err(|e| error("ioctl(NS_GET_USERNS)", e))?;
        if interceptor_sys::userns::is_own_user_namespace(userns.as_fd())
            .map_err(|e| error("stat of its user namespace", e))?
        {
            return Ok(PodUsers::Host);
        }
        let (uid_map, gid_map) = if crate::crash_points::fault!("userns-id-maps-unreadable") {
            Err(std::io::Error::from_raw_os_error(libc::EIO))
        } else {
            interceptor_sys::userns::id_maps(userns.as_fd())
        }
        .map_err(|e| error("joining its user namespace to read its id maps", e))?;
        let parse = |text: &str| {
            IdMap::parse(text).map_err(|e| NetnsError::IdMap {
                path: self.path().to_owned(),
                reason: e.to_string(),
            })
        };
        Ok(PodUsers::Own {
            uid_map: parse(&uid_map)?,
            gid_map: parse(&gid_map)?,
        })
    }
}
