//! Test data that more than one crate's tests run, as plain strings so that every reader gets
//! the same cases without depending on another's code: proxy-init's flags and what each gives
//! (the configuration crate's parser, the CLI's `run` and `pod add`, the CNI plugin's `linkerd`
//! block), and CNI files no installer can change (the installer's tests and the CLI's). A
//! dev-dependency only: nothing shipped links it.
#![no_std]
#![forbid(unsafe_code)]

pub mod flag_cases;
pub mod malformed_cases;
