//! interceptor: eBPF traffic interception for service-mesh proxies, a drop-in replacement for
//! the nat-table rules Linkerd's proxy-init writes.
//!
//! - [`config`]: how a pod is intercepted, as plain data (the `interceptor-config` crate).
//! - [`ebpf`]: the eBPF backend (loader, pod registry); the programs live in `interceptor-ebpf`.
//! - [`node`]: the one table of a node's pods, and the trait its backends implement.
//! - [`iptables`]: the other backend, proxy-init's chains in each pod's namespace.
//! - [`netns`], [`cgroup`]: where pods live and where programs attach.
//! - [`state`]: what a running instance leaves for `status`.
//! - [`agent`]: the node agent (`interceptor daemon`) and its API.
//! - [`kubernetes`]: the Kubernetes API client the agent and the CNI installer share.
//! - [`health`]: the checks `interceptor check` and `linkerd check` (as an extension) run.
//! - [`cli`], [`commands`]: the command line.
//!
//! No unsafe code: raw system calls live in `interceptor-sys`.
#![forbid(unsafe_code)]
pub mod agent;
pub mod bpffs;
pub mod cgroup;
pub mod cli;
pub mod commands;
pub use interceptor_config as config;
pub mod crash_points;
pub mod ebpf;
pub mod health;
pub mod installer;
pub mod iptables;
pub mod kubernetes;
pub mod logging;
pub mod netns;
pub mod node;
pub mod state;
