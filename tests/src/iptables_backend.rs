//! The iptables backend, driven in-process through the same library calls
//! `interceptor run --mode iptables` makes.
use interceptor::{
    config::InterceptionConfig,
    iptables::{self, IptablesMode, IptablesOptions},
};

use crate::{PodFixture, scenario::Backend};

pub struct Iptables(pub IptablesMode);

impl Iptables {
    /// `ipv6` runs the ip6tables pass too, as `--ipv6` does.
    pub fn options(&self, fixture: &PodFixture, ipv6: bool) -> IptablesOptions {
        // -w: tests run in parallel and the xtables lock is machine-wide.
        IptablesOptions {
            mode: self.0,
            wait: true,
            ipv6,
            netns: Some(fixture.pod.path()),
        }
    }
}

/// Removes the chains when dropped.
struct Installed(IptablesOptions);

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = iptables::cleanup(&self.0);
    }
}

impl Backend for Iptables {
    fn attach(&self, fixture: &PodFixture, config: &InterceptionConfig) -> Box<dyn std::any::Any> {
        let options = self.options(fixture, config.ipv6);
        iptables::install(config, &options).unwrap_or_else(|e| panic!("iptables install: {e}"));
        Box::new(Installed(options))
    }

    fn inbound_keeps_local_address(&self) -> bool {
        false
    }
}
