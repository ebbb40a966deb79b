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

    fn differs(&self, _key: NetnsCookie, _pod: &Pod<u32>, _census: Option<&()>) -> Option<String> {
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
