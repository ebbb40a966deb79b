//! One behaviour table, every backend: each scenario of `scenario::OUTBOUND` and
//! `scenario::INBOUND` runs against eBPF, iptables-legacy and iptables-nft. A scenario that
//! passes on one backend and fails on another is a bug in one of them.
use interceptor::iptables::IptablesMode;
use interceptor_tests::{ebpf_backend::Ebpf, iptables_backend::Iptables, privileged, scenario};

macro_rules! scenarios {
    ($backend:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if privileged(concat!(module_path!(), "::", stringify!($name))) {
                scenario::run(&$backend, scenario::scenario(stringify!($name)));
            }
        }
    )*};
}

/// Every row of the table; `every_scenario_has_a_test` keeps this list complete.
macro_rules! table {
    ($backend:expr) => {
        scenarios!($backend;
            redirects_to_a_remote_address,
            redirects_an_unreachable_address,
            proxy_uid_is_exempt,
            proxy_uid_connects_to_the_real_address,
            uid_0_is_never_the_proxy,
            proxy_gid_is_exempt,
            a_gid_is_only_exempt_when_configured,
            loopback_is_exempt,
            all_of_127_8_is_loopback,
            the_pods_own_address_is_exempt,
            an_ignored_port_is_exempt,
            ports_not_ignored_are_redirected,
            a_port_in_an_ignored_range_is_exempt,
            an_ignored_outbound_subnet_is_exempt,
            other_subnets_are_still_redirected,
            running_the_setup_twice_redirects_once,
            inbound_is_steered_to_the_proxy,
            an_ignored_inbound_port_reaches_the_app,
            a_port_in_an_ignored_inbound_range_reaches_the_app,
            a_client_in_an_ignored_subnet_reaches_the_app,
            clients_outside_ignored_subnets_are_steered,
            ports_to_redirect_steers_listed_ports,
            ports_to_redirect_leaves_other_ports_alone,
            the_proxy_port_itself_reaches_the_proxy,
            the_pod_reaching_its_own_address_is_not_steered,
            the_pod_over_loopback_is_not_steered,
            running_the_setup_twice_steers_once,
            the_proxy_forwarding_to_the_app_does_not_loop,
        );
    };
}

mod ebpf {
    use super::*;
    table!(Ebpf);
}

mod iptables_legacy {
    use super::*;
    table!(Iptables(IptablesMode::Legacy));
}

mod iptables_nft {
    use super::*;
    table!(Iptables(IptablesMode::Nft));
}

#[test]
fn every_scenario_has_a_test() {
    let source = include_str!("behaviour_table.rs");
    for s in scenario::OUTBOUND.iter().chain(scenario::INBOUND) {
        assert!(
            source.contains(&format!("            {},\n", s.name)),
            "scenario {} is not in the table",
            s.name
        );
    }
}
