use super::*;

/// The agent's chains record stands in as any JSON.
type Record = PodRecord<serde_json::Value>;

fn read(name: &str, json: &str) -> Result<ReadBack<serde_json::Value>, RecordError> {
    parse(name, json.as_bytes())
}

#[test]
fn an_older_record_of_flags_reads_as_configuration_and_is_marked_for_rewriting() {
    let back = read(
        "42.json",
        r#"{"netns":"/run/netns/p","netns_cookie":42,"meta":{"name":"web"},
           "args":["-p","4143","-o","4140","-u","2102","--outbound-ports-to-ignore","25"]}"#,
    )
    .unwrap();
    assert!(back.older);
    assert_eq!(back.record.meta.name.as_deref(), Some("web"));
    assert_eq!(
        back.record.config.outbound_ports_to_ignore.to_string(),
        "25"
    );
    assert_eq!(
        back.record.backend,
        PodBackend::Ebpf,
        "an older record is eBPF's"
    );
    // Written again, it has the configuration and no flags, and reads back the same.
    let json = to_json(&back.record).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert!(value.get("args").is_none(), "{value}");
    assert_eq!(value["config"]["outbound_ports_to_ignore"], "25");
    let again: ReadBack<serde_json::Value> = parse("42.json", &json).unwrap();
    assert!(!again.older);
    assert_eq!(again.record, back.record);
}

#[test]
fn an_iptables_record_keeps_its_chains() {
    let json = r#"{"netns":"/p","netns_cookie":7,"meta":{},
        "config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140},
        "backend":{"kind":"iptables","mode":"nft","rules":["ipv4 -A X"]}}"#;
    let back = read("7.json", json).unwrap();
    assert!(!back.older);
    assert_eq!(
        back.record.backend,
        PodBackend::Iptables(serde_json::json!({"mode": "nft", "rules": ["ipv4 -A X"]}))
    );
    assert_eq!(back.record.backend.kind(), Backend::Iptables);
}

#[test]
fn a_records_host_ids_are_kept_and_an_older_record_has_none() {
    let mut with_ids = record(9, PodBackend::Ebpf);
    with_ids.host_ids = Some(HostIds {
        proxy_uid: Some(202102),
        proxy_gid: None,
    });
    let json = to_json(&with_ids).unwrap();
    let value: serde_json::Value = serde_json::from_slice(&json).unwrap();
    assert_eq!(value["host_ids"], serde_json::json!({"proxy_uid": 202102}));
    assert_eq!(
        read("9.json", std::str::from_utf8(&json).unwrap())
            .unwrap()
            .record,
        with_ids
    );
    let older = r#"{"netns":"/p","netns_cookie":9,"meta":{},
        "config":{"incoming_proxy_port":4143,"outgoing_proxy_port":4140,"proxy_uid":2102}}"#;
    assert_eq!(read("9.json", older).unwrap().record.host_ids, None);
}

#[test]
fn unusable_records_say_why() {
    let flags = read(
        "43.json",
        r#"{"netns":"/p","netns_cookie":43,"args":["-p","0"]}"#,
    );
    assert!(matches!(flags, Err(RecordError::Flags(_))), "{flags:?}");
    assert!(matches!(read("43.json", "{"), Err(RecordError::Json(_))));
    let ok = r#"{"netns":"/p","netns_cookie":43,"args":[]}"#;
    for name in [
        "43",
        "x.json",
        "043.json",
        "+43.json",
        ".json",
        "43.json.tmp",
    ] {
        assert!(
            matches!(read(name, ok), Err(RecordError::FileName)),
            "{name}"
        );
    }
    let e = read("44.json", ok).unwrap_err();
    assert_eq!(
        e.to_string(),
        "it is the record of pod 43, not of pod 44 as its file name says"
    );
    assert_eq!(
        cookie_of(&file_name(NetnsCookie(u64::MAX))),
        Some(NetnsCookie(u64::MAX))
    );
    assert_eq!(cookie_of("0.json"), Some(NetnsCookie(0)));
}

fn record(cookie: u64, backend: PodBackend<serde_json::Value>) -> Record {
    Record {
        netns: "/p".into(),
        netns_cookie: NetnsCookie(cookie),
        meta: PodMeta::default(),
        config: InterceptionConfig::linkerd(),
        host_ids: None,
        backend,
    }
}

#[test]
fn a_pod_is_restored_by_either_backend_while_its_namespace_is_the_same() {
    let ebpf = record(1, PodBackend::Ebpf);
    let chains = serde_json::json!({"mode": "legacy", "rules": []});
    let iptables = record(2, PodBackend::Iptables(chains.clone()));
    let key = |r: &Record| Found::Key(r.netns_cookie);
    assert_eq!(
        restore_step(&ebpf, Backend::Ebpf, key(&ebpf)),
        Ok(Restore::Ebpf { take_over: false })
    );
    assert_eq!(
        restore_step(&iptables, Backend::Ebpf, key(&iptables)),
        Ok(Restore::Ebpf { take_over: true })
    );
    assert_eq!(
        restore_step(&ebpf, Backend::Iptables, key(&ebpf)),
        Ok(Restore::Iptables { recorded: None })
    );
    assert_eq!(
        restore_step(&iptables, Backend::Iptables, key(&iptables)),
        Ok(Restore::Iptables {
            recorded: Some(&chains)
        })
    );
    assert_eq!(
        restore_step(&ebpf, Backend::Ebpf, Found::Key(NetnsCookie(9))),
        Err(NotRestored::Gone(
            "its network namespace was replaced".into()
        ))
    );
    assert_eq!(
        restore_step(&ebpf, Backend::Iptables, Found::Gone("no such file".into())),
        Err(NotRestored::Gone("no such file".into()))
    );
}

/// Issue 47: a netlink dump that failed in a namespace that is there made the pod pass for gone,
/// and a restart purged a live pod's entries and deleted its record. Such a pod is restored by
/// either backend, and a refusal keeps it; only a replaced namespace is forgotten.
#[test]
fn a_pod_whose_namespace_is_there_but_unread_is_restored_never_forgotten() {
    let ebpf = record(1, PodBackend::Ebpf);
    let chains = serde_json::json!({"mode": "legacy", "rules": []});
    let iptables = record(2, PodBackend::Iptables(chains.clone()));
    let unread = |key| Found::Unread {
        key: NetnsCookie(key),
        why: "RTM_GETROUTE: No buffer space available".into(),
    };
    assert_eq!(
        restore_step(&ebpf, Backend::Ebpf, unread(1)),
        Ok(Restore::Ebpf { take_over: false })
    );
    assert_eq!(
        restore_step(&iptables, Backend::Iptables, unread(2)),
        Ok(Restore::Iptables {
            recorded: Some(&chains)
        })
    );
    assert_eq!(
        restore_step(&ebpf, Backend::Ebpf, unread(9)),
        Err(NotRestored::Gone(
            "its network namespace was replaced".into()
        ))
    );
    let refused = || NotRestored::Refused("the maps are full".into());
    let kept = refused().unread("ENOBUFS", false);
    assert!(
        matches!(kept.clone().then(false), Then::Keep(why) if why.contains("ENOBUFS")),
        "{kept:?}"
    );
    // New maps without the pod would unmesh it at the switch.
    assert!(matches!(
        refused().unread("ENOBUFS", true).then(true),
        Then::Abort(_)
    ));
    let gone = NotRestored::Gone("its network namespace was replaced".into());
    assert_eq!(gone.clone().unread("ENOBUFS", false), gone);
}

#[test]
fn a_pod_not_restored_is_forgotten_kept_or_stops_a_migration() {
    let why = || "x".to_owned();
    assert_eq!(NotRestored::Refused(why()).then(true), Then::Abort(why()));
    assert_eq!(NotRestored::Refused(why()).then(false), Then::Forget(why()));
    for migrating in [false, true] {
        assert_eq!(
            NotRestored::Gone(why()).then(migrating),
            Then::Forget(why())
        );
        assert_eq!(NotRestored::Kept(why()).then(migrating), Then::Keep(why()));
    }
    let registered = [NetnsCookie(1), NetnsCookie(3)];
    assert_eq!(
        leftovers([1, 2, 3, 2, 4].map(NetnsCookie), |c| registered
            .contains(&c)),
        BTreeSet::from([NetnsCookie(2), NetnsCookie(4)])
    );
}

/// Found by the `pod_record` fuzz target: two files holding the record of one pod (4098.json
/// saying pod 4097). Both were read; the one whose namespace is gone made the agent purge pod
/// 4097 from the maps and delete 4097.json, right after restoring it from the other: a live
/// pod lost its interception and its record. A record is now read only from its own file.
#[test]
fn a_second_record_of_a_pod_under_another_file_name_is_not_read() {
    let record = |path: &str| {
        format!(
            r#"{{"netns":"{path}","netns_cookie":4097,"config":{{"incoming_proxy_port":4143,"outgoing_proxy_port":4140}}}}"#
        )
    };
    let own = read("4097.json", &record("/var/run/netns/cni-1")).unwrap();
    assert_eq!(own.record.netns_cookie, NetnsCookie(4097));
    let other = read("4098.json", &record("/var/run/netns/cni-gone"));
    assert!(
        matches!(
            other,
            Err(RecordError::NotItsFile {
                file: NetnsCookie(4098),
                content: NetnsCookie(4097)
            })
        ),
        "{other:?}"
    );
}

/// `take_back`, as `Agent::restore` calls it: the backend's refusal of a pod whose namespace is
/// there but unread keeps the pod; of one read, forgets it; a gone pod never reaches the backend;
/// what the maps hold of a kept pod (a record, no registration) is no leftover.
#[test]
fn take_back_keeps_an_unread_pod_the_backend_refuses() {
    let ebpf = record(1, PodBackend::Ebpf);
    let refuse = |_: Restore<'_, serde_json::Value>| -> Result<(), NotRestored> {
        Err(NotRestored::Refused("the maps are full".into()))
    };
    let unread = Found::Unread {
        key: NetnsCookie(1),
        why: "RTM_GETADDR: No buffer space available".into(),
    };
    assert!(matches!(
        take_back(&ebpf, Backend::Ebpf, unread.clone(), false, refuse),
        Err(Then::Keep(why)) if why.contains("RTM_GETADDR")
    ));
    assert!(matches!(
        take_back(&ebpf, Backend::Ebpf, unread, true, refuse),
        Err(Then::Abort(_))
    ));
    assert!(matches!(
        take_back(
            &ebpf,
            Backend::Ebpf,
            Found::Key(NetnsCookie(1)),
            false,
            refuse
        ),
        Err(Then::Forget(_))
    ));
    let gone = Found::Gone("no such file".into());
    assert!(matches!(
        take_back(
            &ebpf,
            Backend::Ebpf,
            gone,
            false,
            |_| -> Result<(), NotRestored> { panic!("a gone pod reaches the backend") }
        ),
        Err(Then::Forget(_))
    ));
    assert_eq!(
        take_back(
            &ebpf,
            Backend::Ebpf,
            Found::Key(NetnsCookie(1)),
            false,
            |how| {
                assert_eq!(how, Restore::Ebpf { take_over: false });
                Ok(7)
            }
        ),
        Ok(7)
    );
    let recorded = BTreeSet::from([NetnsCookie(1)]);
    let left = leftovers_after_restore(
        [NetnsCookie(1), NetnsCookie(2), NetnsCookie(3)],
        |c| c == NetnsCookie(3),
        &recorded,
    );
    assert_eq!(left, BTreeSet::from([NetnsCookie(2)]));
}
