//! The proxy's UID and GID as the host's kernel knows them.
//!
//! A configuration's `proxy-uid` and `proxy-gid` are ids of the pod: with Kubernetes'
//! `hostUsers: false` the pod has a user namespace of its own, whose ids 0-65535 are, say, the
//! host's 200000-265535. iptables' owner match reads them that way (`make_kuid(net->user_ns,
//! uid)` in `xt_owner`: the network namespace's owning user namespace), while the eBPF programs
//! compare the host's ids (`kuid_t`, what `bpf_get_current_uid_gid` and a socket's `f_cred`
//! hold). So a pod's ids are translated once, when it is registered, through its user
//! namespace's `uid_map` and `gid_map` ([`IdMap`], parsed here from the kernel's text), and the
//! result ([`HostIds`]) is what the eBPF backend writes and the pod's record keeps.
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::InterceptionConfig;

/// A user namespace's `uid_map` or `gid_map`: up to 340 ranges (Linux 4.15; 5 before) of ids
/// inside the namespace and the host's ids they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct IdMap {
    ranges: Vec<IdRange>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IdRange {
    inside: u32,
    outside: u32,
    count: u32,
}

/// The most lines the kernel writes into one map (`UID_GID_MAP_MAX_EXTENTS`).
const MAX_RANGES: usize = 340;

/// Why a map's text is not one the kernel writes.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum IdMapError {
    #[error("line {line} of the id map, {text:?}: {reason}")]
    Line {
        line: usize,
        text: String,
        reason: &'static str,
    },
    #[error("the id map has more than {MAX_RANGES} lines")]
    TooLong,
}

impl IdMap {
    /// Reads `/proc/PID/uid_map` or `gid_map` as the kernel writes it: one `INSIDE OUTSIDE
    /// COUNT` range per line, the outside ids as the reader's user namespace sees them.
    pub fn parse(text: &str) -> Result<Self, IdMapError> {
        let mut ranges = Vec::new();
        for (index, text) in text.lines().enumerate() {
            if text.trim().is_empty() {
                continue;
            }
            if ranges.len() == MAX_RANGES {
                return Err(IdMapError::TooLong);
            }
            let bad = |reason| IdMapError::Line {
                line: index + 1,
                text: text.to_owned(),
                reason,
            };
            let mut fields = text.split_whitespace().map(str::parse::<u32>);
            let (Some(Ok(inside)), Some(Ok(outside)), Some(Ok(count)), None) =
                (fields.next(), fields.next(), fields.next(), fields.next())
            else {
                return Err(bad("not three ids (INSIDE OUTSIDE COUNT)"));
            };
            let fits = |start: u32| start.checked_add(count).is_some();
            if count == 0 || !fits(inside) || !fits(outside) {
                return Err(bad("an empty range, or one past the last id"));
            }
            ranges.push(IdRange {
                inside,
                outside,
                count,
            });
        }
        Ok(Self { ranges })
    }

    /// The host's id for `id` of the namespace, if the map has it.
    pub fn to_host(&self, id: u32) -> Option<u32> {
        self.ranges
            .iter()
            .find(|r| id >= r.inside && id - r.inside < r.count)
            .map(|r| r.outside + (id - r.inside))
    }
}

/// How a pod's user namespace maps its ids to the host's.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum PodUsers {
    /// The pod shares the host's user namespace: its ids are the host's.
    #[default]
    Host,
    /// The pod has a user namespace of its own.
    Own { uid_map: IdMap, gid_map: IdMap },
}

/// The proxy's UID and GID as the host's kernel knows them: what a pod's configuration asks
/// for, translated through its user namespace's maps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIds {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_gid: Option<u32>,
}

impl HostIds {
    /// The ids of a pod in the host's user namespace: its configuration's own.
    pub fn of_host_pod(config: &InterceptionConfig) -> Self {
        Self {
            proxy_uid: config.proxy_uid,
            proxy_gid: config.proxy_gid,
        }
    }
}

/// A configured id the pod's user namespace has no host id for.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "the pod's user namespace does not map its {setting} {id} (it maps {mapped}): no process of the pod can have that id; set {setting} to one of the pod's ids"
)]
pub struct UnmappedId {
    pub setting: &'static str,
    pub id: u32,
    /// The ranges it maps, as `INSIDE-LAST` lists.
    pub mapped: String,
}

impl PodUsers {
    /// `config`'s proxy ids as the host knows them; an id the namespace does not map is
    /// refused, as iptables refuses an owner match for it (`xt_owner`: "uid_valid").
    pub fn host_ids(&self, config: &InterceptionConfig) -> Result<HostIds, UnmappedId> {
        let Self::Own { uid_map, gid_map } = self else {
            return Ok(HostIds::of_host_pod(config));
        };
        let translate = |id: Option<u32>, map: &IdMap, setting| {
            id.map(|id| {
                map.to_host(id).ok_or_else(|| UnmappedId {
                    setting,
                    id,
                    mapped: map.to_string(),
                })
            })
            .transpose()
        };
        Ok(HostIds {
            proxy_uid: translate(config.proxy_uid, uid_map, "proxy-uid")?,
            proxy_gid: translate(config.proxy_gid, gid_map, "proxy-gid")?,
        })
    }
}

impl fmt::Display for IdMap {
    /// The ranges inside the namespace, as `0-65535`, comma separated; `none` when empty.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.ranges.is_empty() {
            return f.write_str("none");
        }
        for (i, r) in self.ranges.iter().enumerate() {
            let sep = if i == 0 { "" } else { "," };
            write!(f, "{sep}{}-{}", r.inside, r.inside + (r.count - 1))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the kubelet asks for with `hostUsers: false`: the pod's 0-65535 are the host's
    /// 200000-265535.
    const POD_MAP: &str = "         0     200000      65536\n";

    fn own(uid_map: &str, gid_map: &str) -> PodUsers {
        PodUsers::Own {
            uid_map: IdMap::parse(uid_map).unwrap(),
            gid_map: IdMap::parse(gid_map).unwrap(),
        }
    }

    #[test]
    fn a_pods_ids_are_translated_through_its_maps() {
        let mut config = InterceptionConfig::linkerd();
        config.proxy_gid = Some(2103);
        let ids = own(POD_MAP, "0 300000 65536\n").host_ids(&config).unwrap();
        assert_eq!(
            ids,
            HostIds {
                proxy_uid: Some(202102),
                proxy_gid: Some(302103)
            }
        );
    }

    #[test]
    fn a_host_pods_ids_are_its_configurations() {
        let config = InterceptionConfig::linkerd();
        let ids = PodUsers::Host.host_ids(&config).unwrap();
        assert_eq!(ids.proxy_uid, Some(2102));
        assert_eq!(ids.proxy_gid, None);
    }

    #[test]
    fn an_id_the_pod_does_not_map_is_refused_by_name() {
        let config = InterceptionConfig::linkerd();
        let e = own("0 200000 1000\n5000 300000 10\n", POD_MAP)
            .host_ids(&config)
            .unwrap_err();
        assert_eq!(e.id, 2102);
        let message = e.to_string();
        assert!(message.contains("proxy-uid 2102"), "{message}");
        assert!(message.contains("0-999,5000-5009"), "{message}");
    }

    #[test]
    fn several_ranges_are_each_looked_up() {
        let map = IdMap::parse("0 1000 1\n1 100000 65535\n").unwrap();
        assert_eq!(map.to_host(0), Some(1000));
        assert_eq!(map.to_host(1), Some(100000));
        assert_eq!(map.to_host(65535), Some(165534));
        assert_eq!(map.to_host(65536), None);
    }

    #[test]
    fn the_whole_id_space_maps_to_its_end() {
        // The initial user namespace's own map, as a process of it reads it.
        let map = IdMap::parse("         0          0 4294967295\n").unwrap();
        assert_eq!(map.to_host(4294967294), Some(4294967294));
        assert_eq!(map.to_host(4294967295), None);
    }

    #[test]
    fn text_the_kernel_does_not_write_is_refused() {
        for bad in [
            "0 200000\n",
            "0 200000 65536 1\n",
            "x 200000 65536\n",
            "0 200000 0\n",
            "4294967295 0 2\n",
            "0 4294967295 2\n",
            "-1 0 1\n",
        ] {
            assert!(IdMap::parse(bad).is_err(), "{bad:?}");
        }
        let long = "0 0 1\n".repeat(MAX_RANGES + 1);
        assert_eq!(IdMap::parse(&long), Err(IdMapError::TooLong));
        assert_eq!(IdMap::parse("").unwrap().to_host(0), None);
    }
}
