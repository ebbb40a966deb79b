//! What the agent reads from outside, parsed: the answers of rtnetlink ([`netlink`]), the
//! `/proc` files it looks through ([`proc`]) and `iptables-save`'s output ([`iptables`]). The
//! reading itself (sockets, files, commands) stays in the `interceptor` crate; these are
//! functions of the bytes read, so the fuzz targets (`fuzz/`) call exactly what the agent calls,
//! without its eBPF build. A bad input is refused or skipped, never a panic.
#![forbid(unsafe_code)]

pub mod iptables;
pub mod netlink;
pub mod proc;
