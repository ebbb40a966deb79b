//! The inbound behaviour table (SPEC "Inbound") against the eBPF backend.
use interceptor_tests::{ebpf_backend::Ebpf, privileged, scenario};

macro_rules! inbound_scenarios {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            if privileged(stringify!($name)) {
                scenario::run(&Ebpf, scenario::scenario(stringify!($name)));
            }
        }
    )*};
}

inbound_scenarios!(
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
    the_proxy_forwarding_to_the_app_does_not_loop,
);

#[test]
fn every_scenario_of_the_table_has_a_test() {
    let source = include_str!("inbound_table_ebpf.rs");
    for s in scenario::INBOUND {
        assert!(source.contains(&format!("    {},\n", s.name)), "scenario {} has no test", s.name);
    }
}
