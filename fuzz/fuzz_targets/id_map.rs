//! A user namespace's `uid_map` or `gid_map` as the agent reads it for a pod with a user
//! namespace of its own (`interceptor_config::user_ids`), then a configuration's proxy ids
//! translated through it: what parses maps each id to at most one host id, a translated id
//! comes from a range that holds it, and a refusal names the id.
//!
//! Input: the map's text. The proxy UID and GID asked for are the first two numbers in it, so
//! they fall inside and outside its ranges.
#![no_main]

use interceptor_config::{
    InterceptionConfig,
    user_ids::{IdMap, PodUsers},
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(map) = IdMap::parse(text) else {
        return;
    };
    let ids: Vec<u32> = text
        .split_whitespace()
        .filter_map(|word| word.parse().ok())
        .chain([0, 2102, 65535, u32::MAX])
        .collect();
    for id in &ids {
        if let Some(host) = map.to_host(*id) {
            // The range that holds it says the same: inside + k maps to outside + k.
            assert!(text.lines().any(|line| {
                let f: Vec<u64> = line.split_whitespace().filter_map(|w| w.parse().ok()).collect();
                f.len() == 3
                    && u64::from(*id) >= f[0]
                    && u64::from(*id) - f[0] < f[2]
                    && f[1] + (u64::from(*id) - f[0]) == u64::from(host)
            }));
        }
    }
    let users = PodUsers::Own {
        uid_map: map.clone(),
        gid_map: map.clone(),
    };
    let mut config = InterceptionConfig::linkerd();
    config.proxy_uid = ids.first().copied().filter(|id| *id > 0);
    config.proxy_gid = ids.get(1).copied().filter(|id| *id > 0);
    match users.host_ids(&config) {
        Ok(host) => {
            assert_eq!(host.proxy_uid, config.proxy_uid.and_then(|id| map.to_host(id)));
            assert_eq!(host.proxy_gid, config.proxy_gid.and_then(|id| map.to_host(id)));
        }
        Err(e) => {
            assert!(map.to_host(e.id).is_none());
            assert!(e.to_string().contains(&e.id.to_string()));
        }
    }
});
