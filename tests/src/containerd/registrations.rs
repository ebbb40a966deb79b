//! The pods the node's agent has registered, as a test checks them.
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Node;

impl Node {
    /// The pods the agent has registered, by name, with their records.
    pub fn registered(&self) -> Vec<(String, Value)> {
        let mut pods: Vec<(String, Value)> = self
            .home
            .pods()
            .into_iter()
            .map(|p| (p["meta"]["name"].as_str().unwrap_or("-").to_owned(), p))
            .collect();
        pods.sort_by(|a, b| a.0.cmp(&b.0));
        pods
    }

    /// Asserts that the agent has registered exactly `names` now, and returns the registrations.
    pub fn assert_registered(&self, names: &[&str]) -> Vec<(String, Value)> {
        let registered = self.registered();
        assert_eq!(
            registered
                .iter()
                .map(|(n, _)| n.as_str())
                .collect::<Vec<_>>(),
            names,
            "{registered:#?}"
        );
        registered
    }

    /// Waits (up to 20 s) until the agent has registered exactly `names`, and returns the
    /// registrations.
    pub fn wait_registered(&self, names: &[&str]) -> Vec<(String, Value)> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let registered = self.registered();
            if registered
                .iter()
                .map(|(n, _)| n.as_str())
                .eq(names.iter().copied())
            {
                return registered;
            }
            assert!(
                Instant::now() < deadline,
                "never registered exactly {names:?}: {registered:#?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
