//! One behaviour table, every backend, every address family: each scenario of
//! `scenario::OUTBOUND` and `scenario::INBOUND` runs against eBPF, iptables-legacy and
//! iptables-nft (ip6tables for IPv6), with connections from `AF_INET` sockets, from `AF_INET6`
//! sockets to IPv4-mapped addresses, and native IPv6. A scenario that passes on one backend or
//! family and fails on another is a bug in one of them.
use interceptor::iptables::IptablesMode;
use interceptor_tests::{
    ebpf_backend::Ebpf,
    iptables_backend::Iptables,
    privileged,
    scenario::{self, Family},
};

macro_rules! scenarios {
    ($backend:expr, $family:expr; $($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if privileged() {
                scenario::run(&$backend, scenario::scenario(stringify!($name)), $family);
            }
        }
    )*};
}

/// Every row of the table for every family; `every_scenario_has_a_test` keeps this list complete.
macro_rules! table {
    ($backend:expr, $family:expr) => {
        scenarios!($backend, $family;
            redirects_to_a_remote_address,
            redirects_an_unreachable_address,
            proxy_uid_is_exempt,
            proxy_uid_connects_to_the_real_address,
            uid_0_is_never_the_proxy,
            proxy_gid_is_exempt,
            a_gid_is_only_exempt_when_configured,
            loopback_is_exempt,
            the_unspecified_address_is_loopback,
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
            the_proxy_outbound_port_reaches_the_inbound_proxy,
            the_pod_reaching_its_own_address_is_not_steered,
            the_pod_over_loopback_is_not_steered,
            running_the_setup_twice_steers_once,
            the_proxy_forwarding_to_the_app_does_not_loop,
        );
    };
}

/// Rows that only have an IPv4 meaning (`Scenario::ipv4_only`).
macro_rules! ipv4_only {
    ($backend:expr, $family:expr) => {
        scenarios!($backend, $family;
            all_of_127_8_is_loopback,
        );
    };
}

macro_rules! backend {
    ($module:ident, $backend:expr) => {
        mod $module {
            use super::*;

            mod ipv4 {
                use super::*;
                table!($backend, Family::Ipv4);
                ipv4_only!($backend, Family::Ipv4);
            }

            mod ipv4_mapped_on_ipv6 {
                use super::*;
                table!($backend, Family::Ipv4MappedOnIpv6);
                ipv4_only!($backend, Family::Ipv4MappedOnIpv6);
            }

            mod ipv6 {
                use super::*;
                table!($backend, Family::Ipv6);
            }
        }
    };
}

backend!(ebpf, Ebpf);
backend!(iptables_legacy, Iptables(IptablesMode::Legacy));
backend!(iptables_nft, Iptables(IptablesMode::Nft));

#[test]
fn every_scenario_has_a_test() {
    let source = include_str!("behaviour_table.rs");
    let section = |start: &str| {
        let from = source.find(start).expect("macro");
        &source[from..from + source[from..].find(");").expect("end of list")]
    };
    let (table, ipv4_only) = (
        section("macro_rules! table"),
        section("macro_rules! ipv4_only"),
    );
    for s in scenario::OUTBOUND.iter().chain(scenario::INBOUND) {
        let list = if s.ipv4_only { ipv4_only } else { table };
        assert!(
            list.contains(&format!("            {},\n", s.name)),
            "scenario {} is not in the {} list",
            s.name,
            if s.ipv4_only { "ipv4_only" } else { "table" }
        );
    }
}
