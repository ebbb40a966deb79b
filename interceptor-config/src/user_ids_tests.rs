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
