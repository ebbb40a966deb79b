//! The outbound behaviour table (SPEC "Outbound") against the eBPF backend.
use interceptor_tests::{ebpf_backend::Ebpf, privileged, scenario};

macro_rules! outbound_scenarios {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if privileged(stringify!($name)) {
                scenario::run(&Ebpf, scenario::scenario(stringify!($name)));
            }
        }
    )*};
}

outbound_scenarios!(
    redirects_to_a_remote_address,
    redirects_an_unreachable_address,
    proxy_uid_is_exempt,
    proxy_uid_reaches_the_real_unreachable_address,
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
);

#[test]
fn every_scenario_of_the_table_has_a_test() {
    let source = include_str!("outbound_table_ebpf.rs");
    for s in scenario::OUTBOUND {
        assert!(source.contains(&format!("    {},\n", s.name)), "scenario {} has no test", s.name);
    }
}
